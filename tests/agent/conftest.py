"""Fixtures for the agent layer: real session stores on disk, a real unit server over loopback HTTP.

The unit server is the real tool layer (`UnitTools` over a real `Host` on a copy of the example units),
served by the real `Bridge`, plus four deterministic tools the reference's online tests need (echo a
token, hand out a nonce, record a value, and one destructive tool). It records every call it receives,
so tests assert on what reached the server, not on what the agent says it did.
"""

from __future__ import annotations

import json
import os
import pty
import secrets
import shutil
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.session import IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from support.recording import TestTool, recording_server, turn_checkpoint
from support.warm_cli import warm_cli

from unit_mcp import Host, UnitService
from unit_mcp.agent import (
    Agent,
    AgentApprovals,
    AgentRegistry,
    AgentRunner,
    AgentToolSurface,
    ApprovedEndpoint,
    McpToolSource,
    SessionStore,
)
from unit_mcp.agent.items import Session
from unit_mcp.bridge import Bridge
from unit_mcp.tools import UnitTools

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_UNITS = REPO / "unit_mcp" / "examples" / "units"
NONCE = "nonce-7f3a91"


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "sessions")


def reload(tmp_path: Path, session_id: str) -> Session:
    """The session as a fresh store loads it from disk (with the load-time repair), store closed after."""
    store = SessionStore(tmp_path / "sessions")
    try:
        return store.require(session_id)
    finally:
        store.close()


SLOW_EVENTS: list[str] = []  # what became of each slow_echo call: "finished" or "cancelled"


async def _slow(args: dict[str, Any]) -> str:
    try:
        await anyio.sleep(float(args.get("seconds", 30)))
    except anyio.get_cancelled_exc_class():
        SLOW_EVENTS.append("cancelled")
        raise
    SLOW_EVENTS.append("finished")
    return "slept"


TEST_TOOLS: dict[str, TestTool] = {
    "echo_token": TestTool(
        "normal",
        {"type": "object", "properties": {"token": {"type": "string"}}, "required": ["token"]},
        lambda args: str(args["token"]),
    ),
    "get_nonce": TestTool("normal", {"type": "object", "properties": {}}, lambda args: json.dumps({"nonce": NONCE})),
    "record_value": TestTool(
        "normal",
        {"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]},
        lambda args: f"recorded:{args['value']}",
    ),
    "wipe_units": TestTool("destructive", {"type": "object", "properties": {}}, lambda args: "wiped"),
    "slow_echo": TestTool("normal", {"type": "object", "properties": {"seconds": {"type": "number"}}}, _slow),
}


@dataclass
class Call:
    name: str
    arguments: dict[str, Any]


@dataclass
class UnitServer:
    bridge: Bridge
    units_root: Path
    calls: list[Call] = field(default_factory=list)
    on_call: dict[str, Callable[[], None]] = field(default_factory=dict)  # run once, before the named tool runs

    @property
    def url(self) -> str:
        assert self.bridge.url is not None
        return self.bridge.url

    @property
    def token(self) -> str:
        assert self.bridge.token is not None
        return self.bridge.token

    def token_file(self, folder: Path) -> str:
        """The token in a 0600 file, for `--mcp-token-file` (a token on a command line is refused)."""
        path = folder / "mcp-token"
        path.write_text(self.token + "\n")
        path.chmod(0o600)
        return str(path)

    def source(self, **options: Any) -> McpToolSource:
        return McpToolSource(self.url, token=self.token, **options)

    def called(self) -> list[str]:
        """The tools called, but for the checkpoint the runner takes at the start of every turn (`checkpoints`)."""
        return [call.name for call in self.calls if call not in self.checkpoints()]

    def model_calls(self) -> list[tuple[str, dict[str, Any]]]:
        """(tool, arguments) of every call but the runner's turn checkpoints."""
        return [(call.name, call.arguments) for call in self.calls if call not in self.checkpoints()]

    def checkpoints(self) -> list[Call]:
        """The runner's own `unit_checkpoint` calls, one at the start of each turn (labelled "session … turn …")."""
        return [call for call in self.calls if turn_checkpoint(call.name, call.arguments)]


@pytest.fixture
async def unit_server(tmp_path: Path) -> AsyncIterator[UnitServer]:
    units = tmp_path / "units"
    shutil.copytree(EXAMPLE_UNITS, units, ignore=shutil.ignore_patterns("__pycache__"))
    with Host(units, tmp_path / "host-data", namespace=f"agent_units_{secrets.token_hex(4)}") as host:
        unit_tools = UnitTools(UnitService(host, test_timeout=30))
        calls: list[Call] = []
        on_call: dict[str, Callable[[], None]] = {}

        def record(name: str, arguments: dict[str, Any]) -> None:
            calls.append(Call(name, arguments))
            on_call.pop(name, lambda: None)()

        async with Bridge(
            recording_server(unit_tools, TEST_TOOLS, record), config_root=tmp_path / "unit-opencode"
        ) as bridge:
            yield UnitServer(bridge, units, calls, on_call)


@asynccontextmanager
async def endpoint_client(
    endpoint: ApprovedEndpoint, mode: str = "auto", *, tools_changed: anyio.Event | None = None
) -> AsyncIterator[Client]:
    """An MCP client of the approval-filtered endpoint over streamable HTTP, with its bearer token; `tools_changed`
    is set when the endpoint says its tool list changed."""

    async def on_message(message: IncomingMessage) -> None:
        if tools_changed is not None and isinstance(message, types.ToolListChangedNotification):
            tools_changed.set()

    assert endpoint.url is not None
    headers = {"Authorization": f"Bearer {endpoint.token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(10, read=60)) as http,
        Client(
            streamable_http_client(endpoint.url, http_client=http), mode=mode, message_handler=on_message
        ) as connected,
    ):
        yield connected


@asynccontextmanager
async def running(
    tmp_path: Path,
    agents: Mapping[str, Callable[[Mapping[str, Any]], Agent]],
    *,
    surface: AgentToolSurface | None = None,
    approvals: AgentApprovals | None = None,
    cancel_timeout: float = 5.0,
) -> AsyncIterator[AgentRunner]:
    """A runner over a store in `tmp_path/sessions` with the given agent factories."""
    surface = surface or AgentToolSurface(approvals or AgentApprovals())
    registry = AgentRegistry()
    for agent_id, factory in agents.items():
        registry.register(agent_id, factory)
    async with AgentRunner(
        store=tmp_path / "sessions", registry=registry, tools=surface, cancel_timeout=cancel_timeout
    ) as runner:
        yield runner


async def ask_on_a_terminal_then_die(data: str, run_args: list[str], *, wait: float) -> str:
    """`python -m unit_mcp.agent --data-dir DATA run RUN_ARGS` on a terminal (a pty), SIGKILLed while its approval
    question waits for an answer (at most `wait` seconds for it to ask); returns what it wrote to stderr. A fork of
    the warm CLI (support.warm_cli), a process of its own like every CLI run here."""
    controller, terminal = pty.openpty()
    err_read, err_write = os.pipe()
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        try:
            first = warm_cli().spawn(
                ["--data-dir", data, "run", *run_args], stdin=terminal, stdout=null, stderr=err_write
            )
        finally:
            os.close(err_write)
            os.close(null)
        asked = b""
        with anyio.fail_after(wait):
            while b"? [y]es / [N]o" not in asked:
                chunk = await anyio.to_thread.run_sync(os.read, err_read, 65536)
                assert chunk, f"the CLI ended before it asked: {asked.decode()}"
                asked += chunk
        first.kill()  # SIGKILL
        first.wait(10)
    finally:
        os.close(err_read)
        os.close(controller)
        os.close(terminal)
    return asked.decode()


async def agent_cli(*args: str, env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
    """`python -m unit_mcp.agent ARGS` in its own process (a fork of the warm CLI, support.warm_cli; `env`: its whole
    environment, default this process's): exit code, stdout, stderr."""
    return await warm_cli().run(list(args), env=env)
