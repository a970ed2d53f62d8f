"""The HTTP surface attacked below the MCP client: wrong Host and Origin, missing or wrong tokens on every
endpoint (the legacy SSE message path included), malformed JSON-RPC, oversized bodies, and clients that hold
streams, sessions and connections open. Each is refused or bounded, and no tool runs without the token."""

from __future__ import annotations

import collections
import contextlib
import json
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from anyio.abc import SocketStream

from unit_mcp import Host
from unit_mcp.agent import ApprovedEndpoint
from unit_mcp.bridge import Bridge
from unit_mcp.mcphttp import DEFAULT_LIMITS

from .clients import call, connect
from .conftest import Served, serve
from .report import Report
from .rpc import ACCEPT, INITIALIZE, PROTOCOL_VERSION

pytestmark = pytest.mark.anyio

PATCH_CALL = {
    "jsonrpc": "2.0",
    "id": 7,
    "method": "tools/call",
    "params": {
        "name": "unit_apply_patch",
        "arguments": {"unit_id": "counter", "source_id": "__init__.py", "old": "step = 1", "new": "step = 666"},
    },
}


# -- a raw HTTP/1.1 client on anyio sockets (the server shares this event loop: nothing may block it) ------


class Raw:
    def __init__(self, stream: SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def send(self, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> None:
        lines = [f"{method} {path} HTTP/1.1", *(f"{key}: {value}" for key, value in headers.items()), "", ""]
        await self.stream.send("\r\n".join(lines).encode() + body)

    async def read_until(self, marker: bytes, timeout: float = 10) -> bytes:
        with anyio.fail_after(timeout):
            while marker not in self.buffer:
                chunk = await self.stream.receive()
                self.buffer += chunk
        head, _, self.buffer = self.buffer.partition(marker)
        return head + marker

    async def status(self, timeout: float = 10) -> int:
        head = await self.read_until(b"\r\n\r\n", timeout)
        return int(head.split(b" ", 2)[1])

    async def closed_by_server(self, timeout: float) -> bool:
        try:
            with anyio.fail_after(timeout):
                while True:
                    self.buffer += await self.stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return True
        except TimeoutError:
            return False


@asynccontextmanager
async def raw(port: int) -> AsyncIterator[Raw]:
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        yield Raw(stream)


def port_of(bridge: Bridge | ApprovedEndpoint) -> int:
    port = bridge.status().port
    assert port is not None
    return port


def base_headers(bridge: Bridge | ApprovedEndpoint, **extra: str) -> dict[str, str]:
    headers = {"Host": f"127.0.0.1:{port_of(bridge)}", "Accept": ACCEPT, "Content-Type": "application/json"}
    headers.update(extra)
    return headers


async def open_sse(bridge: Bridge | ApprovedEndpoint, token: str | None) -> tuple[Raw, str, Any]:
    """A legacy SSE stream held open by a raw socket: the stream, its message path and its context."""
    context = raw(port_of(bridge))
    stream = await context.__aenter__()
    await stream.send("GET", "/sse", base_headers(bridge, Authorization=f"Bearer {token}", Accept="text/event-stream"))
    status = await stream.status()
    if status != 200:
        await context.__aexit__(None, None, None)
        raise AssertionError(f"GET /sse answered {status}")
    event = await stream.read_until(b"\r\n\r\n")
    path = next(line[6:] for line in event.decode().splitlines() if line.startswith("data: "))
    return stream, path.strip(), context


async def streamable_session(http: httpx2.AsyncClient, url: str, token: str | None) -> str:
    response = await http.post(url, json=INITIALIZE, headers={"Authorization": f"Bearer {token}", "Accept": ACCEPT})
    assert response.status_code == 200, response.text
    session = response.headers["mcp-session-id"]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    headers = {"Authorization": f"Bearer {token}", "Accept": ACCEPT, "mcp-session-id": session}
    assert (await http.post(url, json=note, headers=headers)).status_code == 202
    return session


# -- guards --------------------------------------------------------------------------------------------


async def test_no_tool_runs_without_the_token_or_from_a_foreign_origin(
    served: Served, units_root: Path, figures: Report
) -> None:
    bridge, token = served.bridge, served.token
    assert token is not None
    source = units_root / "counter" / "__init__.py"
    before = source.read_bytes()
    port = port_of(bridge)
    statuses: collections.Counter[str] = collections.Counter()
    async with httpx2.AsyncClient(timeout=10) as http:
        session = await streamable_session(http, served.url, token)
        sse_stream, message_path, sse_context = await open_sse(bridge, token)
        try:
            message_url = f"http://127.0.0.1:{port}{message_path}"
            good = {"Authorization": f"Bearer {token}", "mcp-session-id": session, "Accept": ACCEPT}
            wrong_tokens = {
                "no token": {},
                "wrong token": {"Authorization": "Bearer " + "A" * len(token)},
                "token prefix": {"Authorization": f"Bearer {token[:-1]}"},
                "token plus junk": {"Authorization": f"Bearer {token}x"},
                "empty bearer": {"Authorization": "Bearer"},
                "basic scheme": {"Authorization": f"Basic {token}"},
                "token without scheme": {"Authorization": token},
            }
            foreign = {
                "evil Host": {"Host": "evil.example"},
                "evil Host with our port": {"Host": f"evil.example:{port}"},
                "our address, other port": {"Host": f"127.0.0.1:{port + 1}"},
                "rebinding-style Host": {"Host": f"127.0.0.1.evil.example:{port}"},
                "evil Origin": {"Origin": "http://evil.example"},
                "null Origin": {"Origin": "null"},
                "look-alike Origin": {"Origin": "http://127.0.0.1.evil.example"},
                "https evil Origin": {"Origin": f"https://evil.example:{port}"},
            }
            endpoints = [
                ("POST /mcp tools/call", "POST", served.url, PATCH_CALL),
                ("GET /mcp", "GET", served.url, None),
                ("DELETE /mcp", "DELETE", served.url, None),
                ("GET /sse", "GET", f"http://127.0.0.1:{port}/sse", None),
                ("POST /messages/ tools/call", "POST", message_url, PATCH_CALL),
            ]
            for label, headers in {**wrong_tokens, **foreign}.items():
                expected = 401 if label in wrong_tokens else (403 if "Origin" in label else 421)
                merged = {**good, **headers}
                if label == "no token":
                    del merged["Authorization"]
                for where, method, url, body in endpoints:
                    response = await http.request(method, url, json=body, headers=merged)
                    assert response.status_code == expected, f"{where} with {label}: {response.status_code}"
                    statuses[str(expected)] += 1
            # The SSE session saw none of those calls: nothing arrives on its stream.
            with pytest.raises(TimeoutError):
                await sse_stream.read_until(b"data: {", timeout=1)
        finally:
            await sse_context.__aexit__(None, None, None)
    assert source.read_bytes() == before, "no refused call wrote anything"
    log = served.host.log_path.read_text()
    assert "call unit_apply_patch" not in log, "no tool ran"
    figures.record(
        "transport",
        guard_checks=sum(statuses.values()),
        guard_statuses=dict(sorted(statuses.items())),
        endpoints_checked=["POST /mcp", "GET /mcp", "DELETE /mcp", "GET /sse", "POST /messages/?session_id=<live>"],
        tools_run_without_token=0,
    )


# -- malformed JSON-RPC and oversized bodies ------------------------------------------------------------

MALFORMED: list[tuple[str, bytes]] = [
    ("empty body", b""),
    ("not JSON", b"not json"),
    ("truncated JSON", b'{"jsonrpc": "2.0", "id": 1, "method": "tools/ca'),
    ("invalid UTF-8", b'\xff\xfe{"jsonrpc"'),
    ("JSON null", b"null"),
    ("JSON string", b'"tools/call"'),
    ("JSON number", b"42"),
    ("empty batch", b"[]"),
    ("batch of calls", json.dumps([PATCH_CALL, PATCH_CALL]).encode()),
    ("wrong jsonrpc version", json.dumps({**PATCH_CALL, "jsonrpc": "1.0"}).encode()),
    ("no jsonrpc member", json.dumps({k: v for k, v in PATCH_CALL.items() if k != "jsonrpc"}).encode()),
    ("method is a number", json.dumps({**PATCH_CALL, "method": 5}).encode()),
    ("params is a list", json.dumps({**PATCH_CALL, "params": [1, 2]}).encode()),
    ("arguments is a list", json.dumps({**PATCH_CALL, "params": {"name": "unit_list", "arguments": [1]}}).encode()),
    ("tool name is a number", json.dumps({**PATCH_CALL, "params": {"name": 5, "arguments": {}}}).encode()),
    ("id is an object", json.dumps({**PATCH_CALL, "id": {"a": 1}}).encode()),
    ("a response, not a request", b'{"jsonrpc": "2.0", "id": 1, "result": {}}'),
    ("unknown method", b'{"jsonrpc": "2.0", "id": 1, "method": "units/delete_everything"}'),
    (
        "deeply nested",
        b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": ' + b'{"a":' * 5000 + b"1" + b"}" * 5001,
    ),
    ("NUL bytes", b'{"jsonrpc": "2.0", "id": 1, "method": "ping\x00"}'),
    ("duplicate keys", b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "method": "tools/call"}'),
]


async def test_malformed_json_rpc_is_refused_and_the_server_keeps_serving(
    served: Served, units_root: Path, figures: Report
) -> None:
    token, port = served.token, port_of(served.bridge)
    before = (units_root / "counter" / "__init__.py").read_bytes()
    answers: collections.Counter[str] = collections.Counter()
    async with httpx2.AsyncClient(timeout=10) as http, connect(served.url, token) as client:
        session = await streamable_session(http, served.url, token)
        _, message_path, sse_context = await open_sse(served.bridge, token)
        try:
            targets = {
                "/mcp": (served.url, {"mcp-session-id": session, "mcp-protocol-version": PROTOCOL_VERSION}),
                "/messages/": (f"http://127.0.0.1:{port}{message_path}", {}),
            }
            for where, (url, extra) in targets.items():
                for label, body in MALFORMED:
                    headers = {"Authorization": f"Bearer {token}", "Accept": ACCEPT, "Content-Type": "application/json"}
                    response = await http.post(url, content=body, headers={**headers, **extra})
                    assert response.status_code < 500, f"{label} on {where}: {response.status_code} {response.text}"
                    assert str(units_root) not in response.text
                    answers[f"{where} {response.status_code}"] += 1
                    assert not (await call(client, "unit_list", {})).is_error, f"after {label} on {where}"
            wrong_type = await http.post(
                served.url,
                content=json.dumps(PATCH_CALL),
                headers={"Authorization": f"Bearer {token}", "Accept": ACCEPT, "Content-Type": "text/plain"},
            )
            assert wrong_type.status_code in (400, 415)
        finally:
            await sse_context.__aexit__(None, None, None)
    assert (units_root / "counter" / "__init__.py").read_bytes() == before
    figures.record(
        "transport",
        malformed_bodies=len(MALFORMED),
        malformed_answers=dict(sorted(answers.items())),
        malformed_5xx=0,
    )


async def test_oversized_bodies_are_refused_before_they_are_read(host: Host, front: str, figures: Report) -> None:
    async with serve(host, front) as server:
        await oversized_bodies_are_refused(Served(host, server), figures, section(front))


def section(front: str) -> str:
    """The bridge's figures stay in `transport`; an agent endpoint's go to a section of their own."""
    return "transport" if front == "bridge" else f"transport ({front})"


async def oversized_bodies_are_refused(served: Served, figures: Report, section: str) -> None:
    port, token = port_of(served.bridge), served.token
    limit = DEFAULT_LIMITS.max_body_bytes
    outcomes: dict[str, int] = {}
    _, message_path, sse_context = await open_sse(served.bridge, token)
    try:
        for where, path in [("/mcp", "/mcp"), ("/messages/", message_path)]:
            # A declared length over the limit: refused at once, without waiting for a byte of the body.
            async with raw(port) as conn:
                headers = base_headers(served.bridge, Authorization=f"Bearer {token}")
                await conn.send("POST", path, {**headers, "Content-Length": str(1 << 30)})
                outcomes[f"{where}: 1 GiB declared"] = await conn.status(timeout=5)
            # A chunked body that never ends: refused once the limit is passed.
            async with raw(port) as conn:
                headers = base_headers(served.bridge, Authorization=f"Bearer {token}")
                await conn.send("POST", path, {**headers, "Transfer-Encoding": "chunked"})
                chunk = b"%x\r\n%s\r\n" % (1 << 20, b" " * (1 << 20))
                sent = 0
                status = None
                async with anyio.create_task_group() as group:

                    async def read_status() -> None:
                        nonlocal status
                        status = await conn.status(timeout=30)
                        group.cancel_scope.cancel()

                    group.start_soon(read_status)
                    try:
                        while sent <= 2 * limit:
                            await conn.stream.send(chunk)
                            sent += 1 << 20
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        pass
                    await anyio.sleep(30)
                outcomes[f"{where}: endless chunked body (sent {sent >> 20} MiB)"] = status or 0
                assert sent <= limit + (8 << 20), f"the server read {sent >> 20} MiB of an oversized body"
            # Without the token, even the declared size is never looked at: 401 first.
            async with raw(port) as conn:
                await conn.send("POST", path, {**base_headers(served.bridge), "Content-Length": str(1 << 30)})
                outcomes[f"{where}: 1 GiB declared, no token"] = await conn.status(timeout=5)
    finally:
        await sse_context.__aexit__(None, None, None)
    for label, status in outcomes.items():
        assert status == (401 if "no token" in label else 413), f"{label}: {status}"
    async with connect(served.url, token) as client:
        big = await call(
            client, "unit_create_source", {"unit_id": "counter", "source_id": "big.txt", "source": "x" * (12 << 20)}
        )
    # (an agent endpoint passes the tool's error text on, not its error `_meta`)
    assert big.is_error and big.text.startswith("[too_large]"), "a body under the HTTP limit reaches the tool"
    figures.record(
        section,
        max_body_bytes=limit,
        oversized_bodies=outcomes,
        body_of_12_mib_reaches_the_tool_as="too_large",
    )


# -- clients that hold things open ------------------------------------------------------------------------


async def ping(http: httpx2.AsyncClient, url: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}", "Accept": ACCEPT}
    return (await http.post(url, json=INITIALIZE, headers=headers)).status_code


async def test_open_event_streams_are_bounded_and_tools_stay_reachable(host: Host, front: str, figures: Report) -> None:
    async with serve(host, front, max_streams=8) as bridge, httpx2.AsyncClient(timeout=10) as http:
        held = [await open_sse(bridge, bridge.token) for _ in range(8)]
        try:
            with pytest.raises(AssertionError, match="answered 503"):
                await open_sse(bridge, bridge.token)
            refused = await http.get(bridge.sse_url or "", headers={"Authorization": f"Bearer {bridge.token}"})
            assert refused.status_code == 503 and "Too many open event streams" in refused.text
            assert refused.headers["retry-after"] == "1"
            async with connect(bridge.url or "", bridge.token) as client:  # tools over /mcp are still served
                assert not (await call(client, "unit_list", {})).is_error
        finally:
            for _, _, context in held:
                await context.__aexit__(None, None, None)
        with anyio.fail_after(10):  # closed streams free their places
            while True:
                try:
                    _, _, context = await open_sse(bridge, bridge.token)
                except AssertionError:
                    await anyio.sleep(0.05)
                    continue
                await context.__aexit__(None, None, None)
                break
    figures.record(section(front), streams_held_open=8, stream_over_the_limit="503 Retry-After: 1", streams_freed=True)


async def test_sessions_are_bounded(host: Host, front: str, figures: Report) -> None:
    async with serve(host, front, max_sessions=4) as bridge, httpx2.AsyncClient(timeout=10) as http:
        url = bridge.url or ""
        sessions = [await streamable_session(http, url, bridge.token) for _ in range(4)]
        assert await ping(http, url, bridge.token) == 503
        headers = {"Authorization": f"Bearer {bridge.token}", "mcp-session-id": sessions[0]}
        assert (await http.delete(url, headers=headers)).status_code == 200
        assert await ping(http, url, bridge.token) == 200
    figures.record(section(front), sessions_over_the_limit=503, session_freed_by_delete=True)


async def test_connections_are_bounded_and_idle_ones_are_closed(host: Host, front: str, figures: Report) -> None:
    async with serve(host, front, max_connections=16, keep_alive_timeout=1) as bridge:
        port = port_of(bridge)
        async with httpx2.AsyncClient(timeout=10) as http:
            idle = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(16)]
            try:
                assert await ping(http, bridge.url or "", bridge.token) == 200, "an idle connection made room"
            finally:
                for stream in idle:
                    await stream.aclose()
        streams = [await open_sse(bridge, bridge.token) for _ in range(15)]  # requests in flight: no room
        try:
            async with httpx2.AsyncClient(timeout=10) as http:
                assert await ping(http, bridge.url or "", bridge.token) == 503, "beyond the limit: 503"
        finally:
            for _, _, context in streams:
                await context.__aexit__(None, None, None)
        # A client that got its answer and then sits on the connection is disconnected after the keep-alive.
        async with raw(port) as conn:
            await conn.send("GET", "/sse", base_headers(bridge))
            assert await conn.status() == 401
            started = time.perf_counter()
            assert await conn.closed_by_server(timeout=5)
            closed_after = time.perf_counter() - started
    figures.record(
        section(front),
        idle_connections_at_the_limit="closed to make room: the next request is served",
        requests_in_flight_at_the_limit="503 for the next request",
        idle_keep_alive_closed_after_s=round(closed_after, 1),
        defaults={"max_connections": 256, "max_streams": 64, "max_sessions": 512, "keep_alive_timeout_s": 120},
    )


def test_the_server_keeps_an_idle_connection_longer_than_clients_do() -> None:
    """A client reuses an idle connection until its own expiry; a server that closes it at the same moment makes
    that request fail (seen in CI: httpx's ReadError at uvicorn's and httpx's common 5 s). The server waits longer
    than the SDK's client and reqwest's 90 s (Codex), so the client always closes first."""
    client_expiry = httpx2.Limits().keepalive_expiry
    assert client_expiry is not None
    assert DEFAULT_LIMITS.keep_alive_timeout > max(client_expiry, 90)


async def test_requests_that_do_not_arrive_in_time_are_cut_off(host: Host, front: str, figures: Report) -> None:
    """A client that connects and says nothing, trickles its headers or stalls in its body is disconnected once
    the request deadline passes; a request that arrived (an event stream, a client between calls) is not."""
    deadline = 0.5
    async with serve(host, front, request_timeout=deadline) as bridge:
        port = port_of(bridge)
        closed_after: dict[str, float] = {}

        async with raw(port) as silent:
            started = time.perf_counter()
            assert await silent.closed_by_server(timeout=5), "a silent connection is closed"
            closed_after["silent"] = time.perf_counter() - started

        async with raw(port) as trickle:  # a byte every 50 ms, for ever: the deadline does not move
            started = time.perf_counter()
            async with anyio.create_task_group() as tg:

                async def keep_trickling() -> None:
                    await trickle.stream.send(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode())
                    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        while True:
                            await trickle.stream.send(b"x")
                            await anyio.sleep(0.05)

                tg.start_soon(keep_trickling)
                assert await trickle.closed_by_server(timeout=5), "trickled headers are cut off"
                closed_after["trickled headers"] = time.perf_counter() - started
                tg.cancel_scope.cancel()

        async with raw(port) as stalled:  # whole headers, then 10 of the 1000 body bytes announced
            started = time.perf_counter()
            headers = base_headers(bridge, Authorization=f"Bearer {bridge.token}", **{"Content-Length": "1000"})
            await stalled.send("POST", "/mcp", headers, body=b'{"jsonrpc"')
            assert await stalled.closed_by_server(timeout=5), "a stalled body is cut off"
            closed_after["stalled body"] = time.perf_counter() - started

        stream, _, context = await open_sse(bridge, bridge.token)
        try:
            async with connect(bridge.url or "", bridge.token) as client:
                await anyio.sleep(3 * deadline)
                assert not (await call(client, "unit_list", {})).is_error, "a client between calls is served"
            assert not await stream.closed_by_server(timeout=0.3), "an event stream outlives the deadline"
        finally:
            await context.__aexit__(None, None, None)
    for what, seconds in closed_after.items():  # (closed at all is checked above, within 5 s)
        assert seconds >= deadline * 0.9, f"{what} was closed after {seconds:.2f} s, before the deadline"
    figures.record(
        section(front),
        request_deadline_s=deadline,
        closed_after_s={what: round(seconds, 2) for what, seconds in closed_after.items()},
        event_stream_and_idle_client_past_the_deadline="still served",
        default_request_timeout_s=30,
    )


async def test_a_client_that_never_reads_its_stream_slows_no_one_else(
    host: Host, front: str, units_root: Path, figures: Report
) -> None:
    (units_root / "weather" / "atlas.txt").write_text("a line of an atlas, long enough to fill buffers\n" * 40_000)
    async with serve(host, front, max_streams=4) as bridge, httpx2.AsyncClient(timeout=10) as http:
        port = port_of(bridge)
        _, path, context = await open_sse(bridge, bridge.token)  # held open, never read
        try:
            initialize = {**INITIALIZE, "id": 0}
            headers = {"Authorization": f"Bearer {bridge.token}"}
            url = f"http://127.0.0.1:{port}{path}"
            assert (await http.post(url, json=initialize, headers=headers)).status_code == 202
            read = {"unit_id": "weather", "source_id": "atlas.txt"}
            asked = 0
            with anyio.move_on_after(5):  # ~2 MB a result into a stream nobody reads
                for number in range(1, 40):
                    params = {"name": "unit_read_source", "arguments": read}
                    message = {"jsonrpc": "2.0", "id": number, "method": "tools/call", "params": params}
                    await http.post(url, json=message, headers=headers, timeout=1)
                    asked += 1
            latencies = []
            async with connect(bridge.url or "", bridge.token) as client:
                for _ in range(10):
                    started = time.perf_counter()
                    assert not (await call(client, "unit_inspect", {"unit_id": "counter"})).is_error
                    latencies.append(time.perf_counter() - started)
            assert max(latencies) < 3.0, f"a bystander waited {max(latencies):.2f} s"
        finally:
            await context.__aexit__(None, None, None)
        with anyio.fail_after(10):  # the stalled stream's place comes back once it is gone
            opened = []
            while len(opened) < 4:
                try:
                    opened.append(await open_sse(bridge, bridge.token))
                except AssertionError:
                    await anyio.sleep(0.05)
            for _, _, held in opened:
                await held.__aexit__(None, None, None)
    figures.record(
        section(front),
        stalled_reader_requests=asked,
        bystander_max_latency_ms=round(max(latencies) * 1000, 1),
    )


async def test_answers_on_a_kept_alive_connection_are_not_held_back(served: Served, figures: Report) -> None:
    """With Nagle's algorithm on, every answer after the first on a connection waited ~40 ms for a delayed ACK."""
    async with httpx2.AsyncClient(timeout=10) as http:
        session = await streamable_session(http, served.url, served.token)
        headers = {
            "Authorization": f"Bearer {served.token}",
            "Accept": ACCEPT,
            "mcp-session-id": session,
            "mcp-protocol-version": PROTOCOL_VERSION,
        }
        timings = []
        for number in range(40):
            started = time.perf_counter()
            message = {"jsonrpc": "2.0", "id": number, "method": "ping"}
            response = await http.post(served.url, json=message, headers=headers)
            timings.append(time.perf_counter() - started)
            assert response.status_code == 200
    fastest, median = min(timings[5:]) * 1000, statistics.median(timings[5:]) * 1000
    # With Nagle on, no answer after the first comes back in less than the ~40 ms delayed-ACK wait.
    assert fastest < 25, f"the fastest of 35 pings on a kept-alive connection took {fastest:.1f} ms"
    figures.record("transport", keep_alive_ping_ms={"fastest": round(fastest, 1), "median": round(median, 1)})
