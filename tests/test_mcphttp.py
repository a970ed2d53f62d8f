"""`McpHttpServer` answers a handshake-era Streamable HTTP request that asks for no progress with one JSON body and
keeps the event stream for one that does: checked on the wire with the SDK's real client (what content type each
POST was answered with, what arrived), and `wants_progress` held to the SDK's own reading of a progress token.

These tests pin the SDK behaviour `_PerRequestTransport` relies on: the transport reads its JSON flag while serving
the POST, and the dispatcher runs a request's handler in a copy of the context that posted it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from hardening.rpc import ACCEPT, INITIALIZE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params

from unit_mcp import UnitService
from unit_mcp.bridge import Bridge
from unit_mcp.mcphttp import McpHttpServer, wants_progress
from unit_mcp.tools import UnitTools

pytestmark = pytest.mark.anyio


def chatty_server() -> Server[Any]:
    """One tool that sends a request-scoped log message and progress before it answers."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="chatty", input_schema={"type": "object"})])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        note = types.LoggingMessageNotification(
            params=types.LoggingMessageNotificationParams(level="info", data="working on it")
        )
        await ctx.session.send_notification(note, related_request_id=ctx.request_id)
        await ctx.session.report_progress(0.5, 1.0, "half way")
        return types.CallToolResult(content=[types.TextContent(type="text", text="done")])

    return Server("chatty", on_list_tools=list_tools, on_call_tool=call_tool)


class Answers:
    """What each JSON-RPC request POSTed by the client was answered with: (method, content type)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def __call__(self, response: httpx2.Response) -> None:
        request = response.request
        if request.method != "POST":
            return
        message = json.loads(request.content)
        if "id" in message:
            self.seen.append((message["method"], response.headers.get("content-type", "").split(";")[0]))


@asynccontextmanager
async def legacy_client(url: str, token: str | None, answers: Answers, **kwargs: Any) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30, event_hooks={"response": [answers]}) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy", **kwargs) as client,
    ):
        yield client


async def test_a_call_without_progress_is_one_json_body_and_one_with_progress_streams() -> None:
    server = McpHttpServer()
    await server.start(chatty_server())
    logged: list[Any] = []
    progress: list[tuple[float, str | None]] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append(params.data)

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    try:
        answers = Answers()
        assert server.url is not None
        async with legacy_client(server.url, server.token, answers, logging_callback=on_log) as client:
            with anyio.fail_after(20):  # a notification answered in the response's place would hang the call
                quiet = await client.call_tool("chatty", {})
            assert [c.text for c in quiet.content if isinstance(c, types.TextContent)] == ["done"]
            assert logged == [] and progress == []  # dropped, as the SDK's JSON mode drops them
            assert answers.seen == [
                ("initialize", "application/json"),
                ("tools/call", "application/json"),
                ("tools/list", "application/json"),  # the client looks up the tool's output schema
            ]

            answers.seen.clear()
            with anyio.fail_after(20):
                streamed = await client.call_tool("chatty", {}, progress_callback=on_progress)
            assert [c.text for c in streamed.content if isinstance(c, types.TextContent)] == ["done"]
            assert answers.seen == [("tools/call", "text/event-stream")]
            assert logged == ["working on it"] and progress == [(0.5, "half way")]
    finally:
        await server.stop()


async def test_a_cancelled_json_call_is_answered_at_once_and_the_client_closes_cleanly() -> None:
    """The SDK answers a cancelled request only once its handler has settled; a POST waiting for one JSON body
    would stay open until then and could be answered while the client closes (the SDK 2.3 client then raises
    ClosedResourceError out of its task group). The server answers it when the cancel arrives."""
    started, finished = anyio.Event(), anyio.Event()

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="stubborn", input_schema={"type": "object"})])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        started.set()
        with anyio.CancelScope(shield=True):  # like a worker thread that takes a while to stop
            await anyio.sleep(5)
        finished.set()
        return types.CallToolResult(content=[types.TextContent(type="text", text="late")])

    server = McpHttpServer()
    await server.start(Server("stubborn", on_list_tools=list_tools, on_call_tool=call_tool))
    answered_before_the_handler_settled: list[bool] = []

    class Timed(Answers):
        async def __call__(self, response: httpx2.Response) -> None:
            before = len(self.seen)
            await super().__call__(response)
            if len(self.seen) > before and self.seen[-1][0] == "tools/call":
                answered_before_the_handler_settled.append(not finished.is_set())

    try:
        answers = Timed()
        assert server.url is not None
        async with legacy_client(server.url, server.token, answers) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "stubborn", {})
                with anyio.fail_after(10):
                    await started.wait()
                tg.cancel_scope.cancel()
            with anyio.fail_after(4):  # a bound, well inside the handler's 5 s
                while not answered_before_the_handler_settled:
                    await anyio.sleep(0.02)
        assert answered_before_the_handler_settled == [True]
        assert ("tools/call", "application/json") in answers.seen
        assert not finished.is_set()  # the client closed (cleanly) while the handler still ran
    finally:
        await server.stop()


async def test_unit_tools_answer_reads_in_json_and_stream_test_progress(service: UnitService) -> None:
    tools = UnitTools(service, progress_interval=0.1)
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    answers = Answers()
    async with Bridge(tools.server()) as bridge:
        assert bridge.url is not None
        async with legacy_client(bridge.url, bridge.token, answers) as client:
            read = await client.call_tool("unit_read_source", {"unit_id": "counter", "source_id": "__init__.py"})
            assert not read.is_error and read.structured_content is not None
            assert json.loads(read.content[0].text) == read.structured_content  # type: ignore[union-attr]
            slow = "import time\n\n\ndef main():\n    time.sleep(0.5)\n"
            created = await client.call_tool(
                "unit_create_source", {"unit_id": "counter", "source_id": "test_slow.py", "source": slow}
            )
            assert not created.is_error, created.content
            answers.seen.clear()
            run = await client.call_tool(
                "unit_run_tests", {"unit_id": "counter", "test_name": "slow"}, progress_callback=on_progress
            )
            assert not run.is_error and run.structured_content and run.structured_content["passed"]
            assert len(progress) >= 2
            assert answers.seen == [("tools/call", "text/event-stream")]


@pytest.mark.parametrize("meta", [{}, {"_meta": {"progressToken": "p1"}}])
async def test_accept_is_checked_as_for_a_stream_either_way(meta: dict[str, Any]) -> None:
    """Clients must accept both; whether a request asks for progress does not change what is refused."""
    server = McpHttpServer(auth=False)
    await server.start(chatty_server())
    body = {**INITIALIZE, "params": {**INITIALIZE["params"], **meta}}
    try:
        assert server.url is not None
        async with httpx2.AsyncClient(timeout=10) as http:
            refused = await http.post(
                server.url, json=body, headers={"Accept": "application/json", "Content-Type": "application/json"}
            )
            assert refused.status_code == 406
            accepted = await http.post(
                server.url, json=body, headers={"Accept": ACCEPT, "Content-Type": "application/json"}
            )
            assert accepted.status_code == 200
            kind = accepted.headers["content-type"].split(";")[0]
            assert kind == ("text/event-stream" if meta else "application/json")
            assert "mcp-session-id" in accepted.headers
    finally:
        await server.stop()


# -- the body peek ---------------------------------------------------------------------------------------------

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6)
json_values = scalars | st.lists(scalars, max_size=2) | st.dictionaries(st.text(max_size=4), scalars, max_size=2)
metas = st.dictionaries(st.sampled_from(["progressToken", "other", "progresstoken"]), json_values, max_size=3)
params = st.none() | st.dictionaries(st.sampled_from(["_meta", "name", "arguments"]), metas | json_values, max_size=3)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    params=params,
    method=st.sampled_from(["tools/call", "initialize", "notifications/initialized"]),
    ascii_only=st.booleans(),
    escape_key=st.booleans(),
)
def test_wants_progress_reads_the_token_as_the_sdk_does(
    params: dict[str, Any] | None, method: str, ascii_only: bool, escape_key: bool
) -> None:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": 7, "method": method}
    if params is not None:
        message["params"] = params
    body = json.dumps(message, ensure_ascii=ascii_only)
    if escape_key:  # the same key, spelled with a JSON escape
        body = body.replace('"progressToken"', '"progress\\u0054oken"')
    expected = isinstance(params, dict) and progress_token_from_params(params) is not None
    assert wants_progress(body.encode()) is expected


@pytest.mark.parametrize("body", [b"", b"{", b"[1, 2]", b'"progressToken"', b'{"params": "\\u0041"}'])
def test_wants_progress_leaves_what_is_not_a_request_to_the_sdk(body: bytes) -> None:
    assert wants_progress(body) is False
