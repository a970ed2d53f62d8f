"""McpToolSource: one MCP server the tool surface takes tools from, as a plain MCP client.

This is the only way the agent layer reaches the unit tools: over Streamable HTTP (or legacy SSE) with a
bearer token, or in memory for tests. The tool list is kept fresh: a handshake-era server's
`notifications/tools/list_changed` and a 2026-era server's `subscriptions/listen` event both trigger a
re-list, and listeners (the surface, and through it the approval-filtered endpoint) are told when it changed.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from typing import Any, Literal, cast

import anyio
import anyio.abc
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.session import IncomingMessage
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError
from mcp.server import Server
from mcp.shared.exceptions import MCPError

from .. import tracing
from ..wire import REPLAY_META_KEY, SSE_PATH
from ._listeners import ChangeListener, Listeners
from .turns import describe

log = logging.getLogger("unit_mcp.agent.mcpsource")
REPLAYING: contextvars.ContextVar[bool] = contextvars.ContextVar("unit_mcp_agent_replaying", default=False)
"""True while a call may be a repeat of one whose result is in place (a durable step): the unit server is told
so (`wire.REPLAY_META_KEY`) and answers such a write `already_applied` instead of `stale_hash`."""


class McpRefused(ConnectionError):
    """The server answered the connection attempt with an HTTP refusal (401: the token; 403, 421: Origin, Host)."""


class McpToolSource:
    """An entered MCP client plus its current tool list. Enter and exit it in the same task."""

    def __init__(
        self,
        target: str | Server[Any],
        *,
        name: str = "unit",
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
        prefix: str = "",
        mode: Literal["auto", "legacy"] = "auto",
        timeout: float = 30.0,
    ) -> None:
        self.target = target
        self.name = name
        self.prefix = prefix
        self.mode = mode
        self.timeout = timeout
        self.headers = dict(headers or {})
        if token is not None:
            self.headers["Authorization"] = f"Bearer {token}"
        self.tools: list[types.Tool] = []
        self.instructions: str | None = None
        self._client: Client | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._closing = anyio.Event()
        self._owner_done = anyio.Event()
        self.failure: BaseException | None = None
        self._listeners = Listeners(f"tool-list (MCP source {self.name})")
        self._refresh_lock = anyio.Lock()
        self.refused: int | None = None
        """The HTTP status of the last refusal (401, 403, 404, 421) while connecting, if there was one."""

    @property
    def connected(self) -> bool:
        return self._client is not None

    @property
    def client(self) -> Client:
        if self._client is None:
            lost = f" (connection lost: {self.failure})" if self.failure else ""
            raise ConnectionError(f"MCP source {self.name!r} is not connected{lost}")
        return self._client

    async def __aenter__(self) -> McpToolSource:
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg, self._closing, self._owner_done, self.failure = tg, anyio.Event(), anyio.Event(), None
        try:
            await tg.start(self._own)
        except BaseException as exc:
            tg.cancel_scope.cancel()
            self._tg = None
            try:
                await tg.__aexit__(type(exc), exc, exc.__traceback__)
            except Exception as failure:
                if self.refused is None:
                    raise
                refusal = f"the MCP server at {self.target} refused the connection (HTTP {self.refused})"
                raise McpRefused(refusal) from failure
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        tg, self._tg = self._tg, None
        if tg is None:
            return
        self._closing.set()
        await self._owner_done.wait()
        tg.cancel_scope.cancel()
        await tg.__aexit__(None, None, None)

    async def _own(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The connection lives in this task: the SDK's transport tasks fail here when the server goes away,
        so a lost server fails the calls that need it, never the code that entered the source."""
        started = False
        try:
            async with AsyncExitStack() as stack:
                client = await stack.enter_async_context(await self._connect(stack))
                self._client = client
                self.instructions = client.instructions
                await self.refresh()
                capability = client.server_capabilities.tools
                if self.mode != "legacy" and capability is not None and capability.list_changed:
                    assert self._tg is not None
                    await self._tg.start(self._listen)
                started = True
                task_status.started()
                await self._closing.wait()
        except Exception as exc:
            if not started:
                raise
            self.failure = exc
            log.warning("MCP source %s lost its connection: %s", self.name, describe(exc))
        finally:
            self._client = None
            self._owner_done.set()

    def on_change(self, listener: ChangeListener) -> Callable[[], None]:
        return self._listeners.add(listener)

    async def refresh(self) -> bool:
        """Re-list the server's tools; tell listeners and return True if the list changed."""
        async with self._refresh_lock:
            tools: list[types.Tool] = []
            cursor: str | None = None
            while True:
                page = await self.client.list_tools(cursor=cursor, cache_mode="refresh")
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    break
            changed = [t.model_dump(by_alias=True) for t in tools] != [t.model_dump(by_alias=True) for t in self.tools]
            self.tools = tools
        if changed:
            self._listeners.notify()
        return changed

    async def call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Call a tool; raises `ConnectionError` once the connection is gone (an error result stays a result)."""
        meta: types.RequestParamsMeta | None = None
        if REPLAYING.get():
            meta = cast(types.RequestParamsMeta, {REPLAY_META_KEY: True})  # an extra key, which the TypedDict allows
        if tracing.enabled():  # the server continues this trace (`traceparent` in `_meta`)
            meta = cast(types.RequestParamsMeta, tracing.inject_meta(dict(meta or {})))
        try:
            return await self.client.call_tool(name, arguments, meta=meta)
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED or not self.connected:
                raise ConnectionError(f"MCP source {self.name!r} lost its connection during {name}") from None
            raise

    async def _connect(self, stack: AsyncExitStack) -> Client:
        target = self.target
        if not isinstance(target, str):
            return Client(target, mode=self.mode, message_handler=self._on_message)
        if target.rstrip("/").endswith(SSE_PATH):
            self.mode = "legacy"
            transport = sse_client(target, headers=self.headers, timeout=self.timeout)
            return Client(transport, mode="legacy", message_handler=self._on_message)
        http = await stack.enter_async_context(
            httpx2.AsyncClient(
                headers=self.headers,
                timeout=httpx2.Timeout(self.timeout, read=300.0),
                event_hooks={"response": [self._note_refusal]},
            )
        )
        return Client(
            streamable_http_client(target, http_client=http), mode=self.mode, message_handler=self._on_message
        )

    async def _note_refusal(self, response: httpx2.Response) -> None:
        if response.status_code in (401, 403, 404, 421) and not self.connected:
            self.refused = response.status_code

    async def _on_message(self, message: IncomingMessage) -> None:
        """Handshake-era change notifications arrive here; the re-list runs in its own task (the handler
        runs on the MCP session's receive loop, which must stay free to read the answer)."""
        if isinstance(message, types.ToolListChangedNotification) and self._tg is not None:
            self._tg.start_soon(self._refresh_quietly)

    async def _refresh_quietly(self) -> None:
        try:
            await self.refresh()
        except Exception:
            log.warning("MCP source %s: re-listing tools after a change notification failed", self.name, exc_info=True)

    async def _listen(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """2026-era servers deliver change events on a `subscriptions/listen` stream. Entering the source waits
        for the first subscription; each (re)subscription re-lists, since changes before it are not replayed."""
        started = False
        while self._client is not None:
            try:
                async with self.client.listen(tools_list_changed=True) as subscription:
                    if not started:
                        started = True
                        task_status.started()
                    await self._refresh_quietly()
                    async for _event in subscription:
                        await self._refresh_quietly()
                return
            except ListenNotSupportedError:
                break
            except (MCPError, RuntimeError) as exc:
                log.debug("MCP source %s: change subscription ended (%s)", self.name, exc)
            except Exception:
                log.warning("MCP source %s: change subscription failed", self.name, exc_info=True)
            if not started:
                started = True
                task_status.started()
            await anyio.sleep(1.0)
        if not started:
            task_status.started()
