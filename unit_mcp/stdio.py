"""MCP over this process's stdin/stdout on asyncio pipes, for clients that launch the server.

On pipes or sockets it reads and writes itself instead of through the SDK's worker-thread transport (anything
else gets the SDK's). While serving, fd 0 reads the null device and fd 1 writes to stderr so unit code cannot
corrupt the wire, and the end of stdin reaches the server only once every request read has been answered.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import stat
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from typing import Any, Protocol

import anyio
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared._stream_protocols import WriteStream
from mcp.shared.message import ServerMessageMetadata, SessionMessage
from mcp_types import JSONRPCError, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse, jsonrpc_message_adapter

log = logging.getLogger("unit_mcp.stdio")

MAX_LINE_BYTES = 64 * 1024 * 1024
"""The longest JSON-RPC message read; a longer line is dropped (and logged) and the server reads on."""

DRAIN_SECONDS = 30.0
"""How long the requests read before stdin ended may take to be answered before the server stops anyway."""


class _Unanswered:
    """The ids of the requests read and not answered yet, and of the server's own requests to the client (an
    elicitation) not answered yet, each with the client's request it was sent for."""

    def __init__(self) -> None:
        self.ids: set[str | int] = set()
        self.none = anyio.Event()
        self.none.set()
        self.to_client: dict[str | int, str | int] = {}

    def hopeless(self) -> list[str | int]:
        """Once stdin ended, the requests that wait for the client's answer to the server's request: forgotten."""
        waiting = sorted({r for r in self.to_client.values() if r in self.ids}, key=str)
        self.to_client.clear()
        for request_id in waiting:
            self.answered(request_id)  # cancelled: the SDK sends no answer, and the drain must not wait for one
        return waiting

    def asked(self, request_id: str | int) -> None:
        if not self.ids:
            self.none = anyio.Event()
        self.ids.add(request_id)

    def answered(self, request_id: str | int) -> None:
        self.ids.discard(request_id)
        if not self.ids:
            self.none.set()


class AnsweringWriter:
    """The server's write stream (the SDK's `WriteStream` protocol), noting every answer that goes out."""

    def __init__(self, inner: WriteStream[SessionMessage], unanswered: _Unanswered) -> None:
        self.inner = inner
        self.unanswered = unanswered

    async def send(self, item: SessionMessage, /) -> None:
        await self.inner.send(item)
        message, metadata = item.message, item.metadata
        if isinstance(message, JSONRPCResponse | JSONRPCError) and message.id is not None:
            self.unanswered.answered(message.id)
        elif (
            isinstance(message, JSONRPCRequest)
            and isinstance(metadata, ServerMessageMetadata)
            and metadata.related_request_id is not None
        ):
            self.unanswered.to_client[message.id] = metadata.related_request_id

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> AnsweringWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _Receiver(Protocol):
    async def receive(self) -> SessionMessage | Exception: ...

    async def aclose(self) -> None: ...


class DrainingReader:
    """The server's read stream (the SDK's `ReadStream` protocol), noting every request read; its end reaches the
    server once every request read has been answered, or after `DRAIN_SECONDS`."""

    def __init__(self, inner: _Receiver, unanswered: _Unanswered) -> None:
        self.inner = inner
        self.unanswered = unanswered
        self.cancelling: list[SessionMessage] = []

    async def receive(self) -> SessionMessage | Exception:
        if self.cancelling:
            return self.cancelling.pop()
        try:
            item = await self.inner.receive()
        except anyio.EndOfStream:
            if hopeless := self.unanswered.hopeless():
                log.info("stdin ended; cancelling %d request(s) that waited for the client's answer", len(hopeless))
                self.cancelling = [_cancel(request_id) for request_id in hopeless]
                return self.cancelling.pop()
            with anyio.move_on_after(DRAIN_SECONDS) as waited:
                await self.unanswered.none.wait()
            if waited.cancelled_caught:
                left = len(self.unanswered.ids)
                log.warning("stdin ended; %d request(s) still unanswered after %.0f s", left, DRAIN_SECONDS)
            raise
        if isinstance(item, SessionMessage) and isinstance(item.message, JSONRPCRequest):
            self.unanswered.asked(item.message.id)
        elif isinstance(item, SessionMessage) and isinstance(item.message, JSONRPCResponse | JSONRPCError):
            self.unanswered.to_client.pop(item.message.id or "", None)
        return item

    def __aiter__(self) -> DrainingReader:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> DrainingReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _cancel(request_id: str | int) -> SessionMessage:
    """The `notifications/cancelled` a client that can no longer answer would have sent for `request_id`."""
    params = {"requestId": request_id, "reason": "stdin ended while the request waited for the client's answer"}
    return SessionMessage(JSONRPCNotification(jsonrpc="2.0", method="notifications/cancelled", params=params))


Streams = tuple[DrainingReader, AnsweringWriter]


def _is_pipe(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


@asynccontextmanager
async def stdio_streams() -> AsyncIterator[Streams]:
    """The server's read and write streams over stdin/stdout (asyncio pipes read and written in the asking task
    when both are pipes or sockets, else the SDK's transport), whose end of input waits for the answers."""
    unanswered = _Unanswered()
    if not (_is_pipe(0) and _is_pipe(1)):
        async with stdio_server() as (read_stream, write_stream):
            try:
                yield DrainingReader(read_stream, unanswered), AnsweringWriter(write_stream, unanswered)
            finally:
                _flush_stdout()
        return
    async with AsyncExitStack() as stack:
        stdin_fd = _claim(0, os.open(os.devnull, os.O_RDONLY), stack)
        stdout_fd = _claim(1, os.dup(2), stack)
        stack.callback(_flush_stdout)  # before fd 1 is restored: what units printed belongs on stderr
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
        read_transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(stdin_fd, "rb", buffering=0, closefd=False)
        )
        stack.callback(read_transport.close)
        write_transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(stdout_fd, "wb", buffering=0, closefd=False)
        )
        stack.callback(write_transport.close)
        writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
        yield (
            DrainingReader(_StdinMessages(_Lines(reader)), unanswered),
            AnsweringWriter(_StdoutMessages(writer), unanswered),
        )


def _claim(fd: int, diversion: int, stack: AsyncExitStack) -> int:
    """Move the wire end of `fd` to a private descriptor and point `fd` at `diversion` until the stack closes
    (after the pipe transports, which leave the descriptor open: `closefd=False`)."""
    private = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.dup2(diversion, fd)
    os.close(diversion)

    def restore() -> None:
        os.set_blocking(private, True)  # asyncio made it non-blocking; the restored fd shares that flag
        os.dup2(private, fd)
        os.close(private)

    stack.callback(restore)
    return private


def _flush_stdout() -> None:
    with suppress(Exception):
        sys.stdout.flush()


class _Lines:
    """stdin as the async iterator of text lines the SDK's reader expects; ends at EOF."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        while True:
            try:
                line = await self.reader.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    raise StopAsyncIteration from None
                line = exc.partial
            except asyncio.LimitOverrunError:
                await self._skip_line()
                continue
            return line.decode("utf-8", "replace")

    async def _skip_line(self) -> None:
        """Drop a line longer than MAX_LINE_BYTES without holding it in memory."""
        dropped = 0
        while True:
            try:
                dropped += len(await self.reader.readuntil(b"\n"))
                break
            except asyncio.LimitOverrunError as exc:
                dropped += len(await self.reader.readexactly(exc.consumed))
            except asyncio.IncompleteReadError as exc:
                dropped += len(exc.partial)
                break
        log.warning("dropped a message of %d bytes on stdin (limit %d)", dropped, MAX_LINE_BYTES)


class _StdinMessages:
    """The JSON-RPC messages on stdin, one a line, parsed as the SDK's stdio transport parses them: a line that is
    not a message becomes the exception the server answers, and reading goes on."""

    def __init__(self, lines: _Lines) -> None:
        self.lines = lines

    async def receive(self) -> SessionMessage | Exception:
        try:
            line = await self.lines.__anext__()
        except StopAsyncIteration:
            raise anyio.EndOfStream from None
        try:
            return SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
        except Exception as exc:
            return exc

    async def aclose(self) -> None:
        pass  # the pipe is closed by `stdio_streams`


class _StdoutMessages:
    """stdout as the server's write stream: each message is one line, written by the task that sends it, which waits
    while the client is not reading."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    async def send(self, item: SessionMessage, /) -> None:
        if self.writer.is_closing():
            raise anyio.BrokenResourceError
        line = item.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
        self.writer.write(line.encode("utf-8"))
        try:
            await self.writer.drain()
        except (ConnectionError, BrokenPipeError):
            raise anyio.BrokenResourceError from None

    async def aclose(self) -> None:
        pass  # the pipe is closed by `stdio_streams`

    async def __aenter__(self) -> _StdoutMessages:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def first_signal(signals: AsyncIterator[int]) -> None:
    """Wait for the first SIGINT or SIGTERM, and say so in the log."""
    async for signum in signals:
        log.info("stopping on %s", signal.Signals(signum).name)
        return


async def serve_until_stopped(
    server: Server[Any], streams: Streams | None, serve_http: Callable[[], Awaitable[None]]
) -> None:
    """Serve `server` on `streams` (stdio) until they close, or run `serve_http` (which starts the bridge and
    sleeps), until SIGINT/SIGTERM. The one serve loop of `python -m unit_mcp.server` and `python -m
    unit_mcp.fleet`; the caller's exit stack, entered before, cleans up after. It lives here, not beside the
    bridge, so that a server on stdio imports no HTTP serving of its own."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as group:

            async def stop_on_signal() -> None:
                await first_signal(signals)
                group.cancel_scope.cancel()

            group.start_soon(stop_on_signal)
            if streams is not None:
                read_stream, write_stream = streams
                await server.run(read_stream, write_stream, server.create_initialization_options())
            else:
                await serve_http()
            group.cancel_scope.cancel()
