"""A person's yes on every transport: a client whose connection drops while its call waits (no cancel sent)
withdraws its question at once, over Streamable HTTP (one JSON body, or an event stream), legacy SSE and stdio;
over stdio a client with elicitation is asked and its yes or no decides, in both protocol eras (stdio negotiates
2026-07-28 in `auto` mode, where the question comes in the call's `input_required` result)."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from support.confirm_page import logged_changes

from .conftest import page_client
from .test_confirm import EXAMPLE_UNITS, PATCH, WAIT, Served, answering, refusal, served, waiting, withdrawn

pytestmark = pytest.mark.anyio
HANDSHAKE = "2025-11-25"
CALL = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "unit_apply_patch", "arguments": PATCH}}


def initialize(capabilities: dict[str, Any] | None = None) -> dict[str, Any]:
    params = {
        "protocolVersion": HANDSHAKE,
        "capabilities": capabilities or {},
        "clientInfo": {"name": "raw", "version": "1"},
    }
    return {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}


INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def authorized(server: Served) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.bridge.token}", "Accept": "application/json, text/event-stream"}


@pytest.mark.parametrize("answer", ["json", "event-stream"])
async def test_a_dropped_streamable_http_connection_withdraws_the_question(tmp_path: Path, answer: str) -> None:
    """A call without a progress token is answered as one JSON body, one with a token on an event stream."""
    async with served(tmp_path, ["shell"]) as server:
        assert server.bridge.url is not None
        url, headers = server.bridge.url, authorized(server)
        async with httpx2.AsyncClient(timeout=WAIT) as http:
            started = await http.post(url, json=initialize(), headers=headers)
            assert started.status_code == 200, started.text
            headers |= {"mcp-session-id": started.headers["mcp-session-id"], "mcp-protocol-version": HANDSHAKE}
            assert (await http.post(url, json=INITIALIZED, headers=headers)).status_code == 202
            call = CALL if answer == "json" else {**CALL, "params": {**CALL["params"], "_meta": {"progressToken": 7}}}

            async def call_and_drop() -> None:
                async with httpx2.AsyncClient(timeout=WAIT) as own:  # its own connection, closed on cancel
                    await own.post(url, json=call, headers=headers)

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(call_and_drop)
                await waiting(server)
                tasks.cancel_scope.cancel()
            await waiting(server, 0)
            await withdrawn(server)
            listed = await http.post(url, json={**CALL, "id": 3, "method": "tools/list", "params": {}}, headers=headers)
            assert listed.status_code == 200 and "unit_apply_patch" in listed.text  # the session goes on
        assert not server.greeting_changed()


async def test_a_dropped_sse_connection_withdraws_the_question(tmp_path: Path) -> None:
    async with served(tmp_path, ["shell"]) as server, httpx2.AsyncClient(timeout=WAIT) as http:
        assert server.bridge.sse_url is not None and server.bridge.base_url is not None
        headers = authorized(server)
        async with http.stream("GET", server.bridge.sse_url, headers=headers) as stream:
            lines = stream.aiter_lines()
            messages = await _sse_data(lines)
            post_url = server.bridge.base_url + messages
            assert (await http.post(post_url, json=initialize(), headers=headers)).status_code == 202
            assert json.loads(await _sse_data(lines))["id"] == 1
            assert (await http.post(post_url, json=INITIALIZED, headers=headers)).status_code == 202
            assert (await http.post(post_url, json=CALL, headers=headers)).status_code == 202
            await waiting(server)
        await waiting(server, 0)  # the event stream closed: the call is cancelled with its connection
        await withdrawn(server)
        assert not server.greeting_changed()


async def _sse_data(lines: AsyncIterator[str]) -> str:
    with anyio.fail_after(WAIT):
        async for line in lines:
            if line.startswith("data:"):
                return line.removeprefix("data:").strip()
    raise AssertionError("the event stream ended")


@asynccontextmanager
async def stdio_server(tmp_path: Path) -> AsyncIterator[tuple[Path, list[str]]]:
    units = tmp_path / "units"
    shutil.copytree(EXAMPLE_UNITS, units, ignore=shutil.ignore_patterns("__pycache__"))
    data = tmp_path / "data"
    args = ["-m", "unit_mcp.server", "--stdio", "--confirm", "shell", "--units", str(units), "--data-dir", str(data)]
    yield units, args


def logged(data: Path) -> list[tuple[str, str | None]]:
    return [(c.outcome, c.error_code) for c in logged_changes(data) if c.outcome != "applied"]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize("approve", [True, False])
async def test_over_stdio_the_client_is_asked_and_its_answer_decides(tmp_path: Path, approve: bool, mode: str) -> None:
    asked: list[str] = []
    async with stdio_server(tmp_path) as (units, args):
        params = StdioServerParameters(command=sys.executable, args=args)
        elicit = answering("accept", approve, asked)
        async with Client(stdio_client(params), mode=mode, elicitation_callback=elicit) as client:  # type: ignore[arg-type]
            result = await client.call_tool("unit_apply_patch", PATCH)
            if approve:
                assert not result.is_error, result
            else:
                assert refusal(result) == "declined"
    assert len(asked) == 1 and "unit_apply_patch (risk shell)" in asked[0]
    assert ("Howdy" in (units / "greeter.py").read_text()) is approve
    answer = ("approved", None) if approve else ("declined", "declined")
    assert logged(tmp_path / "data") == [("asked", None), answer]


async def test_over_stdio_the_end_of_input_withdraws_the_question_at_once(tmp_path: Path) -> None:
    """The server's stdin ends while it waits for the client's answer to its elicitation: the call is cancelled
    at once (not after the drain that lets other requests finish), and the question recorded withdrawn."""
    async with stdio_server(tmp_path) as (units, args):
        process = await anyio.open_process([sys.executable, *args])
        assert process.stdin is not None and process.stdout is not None
        try:
            lines = _lines(process.stdout)
            await process.stdin.send((json.dumps(initialize({"elicitation": {"form": {}}})) + "\n").encode())
            assert (await anext(lines))["id"] == 1
            for message in (INITIALIZED, CALL):
                await process.stdin.send((json.dumps(message) + "\n").encode())
            with anyio.fail_after(WAIT):
                asked = await anext(lines)
            assert asked.get("method") == "elicitation/create", asked
            await process.stdin.aclose()
            with anyio.fail_after(WAIT):
                await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
            await process.aclose()
    assert process.returncode == 0
    assert logged(tmp_path / "data") == [("asked", None), ("withdrawn", None)]
    app_log = (tmp_path / "data" / "logs" / "app.log").read_text()
    assert "cancelling 1 request(s) that waited for the client's answer" in app_log  # not left to the drain
    assert "Howdy" not in (units / "greeter.py").read_text()


async def _lines(stream: Any) -> AsyncIterator[dict[str, Any]]:
    buffered = b""
    async for chunk in stream:
        buffered += chunk
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            yield json.loads(line)


@pytest.mark.parametrize("answer", ["yes", "no", "page"])
async def test_over_sse_the_client_is_asked_or_the_page_answers(tmp_path: Path, answer: str) -> None:
    """The SDK's legacy SSE client: with an elicitation handler its yes or no decides; without one, the page."""
    asked: list[str] = []
    elicit = None if answer == "page" else answering("accept", answer == "yes", asked)
    async with served(tmp_path, ["shell"]) as server:
        assert server.bridge.sse_url is not None
        transport = sse_client(  # the legacy SSE transport, its session named in the message URL
            server.bridge.sse_url, headers={"Authorization": f"Bearer {server.bridge.token}"}
        )
        async with Client(transport, mode="legacy", elicitation_callback=elicit) as c:
            if answer == "page":
                async with page_client(server.page.login_url(server.base)) as page, anyio.create_task_group() as tg:
                    results: list[types.CallToolResult] = []

                    async def call() -> None:
                        results.append(await c.call_tool("unit_apply_patch", PATCH))

                    tg.start_soon(call)
                    await waiting(server)
                    question = server.confirmations.questions()[0]
                    assert question.caller.session_id is not None  # SSE names its session: a grant would be its
                    url = f"/questions/{question.id}/approve"
                    assert (await page.post(url, headers={"Origin": server.bridge.base_url})).status_code in (200, 303)
                result = results[0]
            else:
                result = await c.call_tool("unit_apply_patch", PATCH)
        if answer == "no":
            assert refusal(result) == "declined"
        else:
            assert not result.is_error, result
        assert server.greeting_changed() is (answer != "no")
        assert len(asked) == (0 if answer == "page" else 1)
