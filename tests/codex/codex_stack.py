"""The whole stack a Codex agent test needs, every part real, in one fresh root per test.

The real unit server (Host + UnitTools + Bridge over loopback HTTP on a copy of the example units) also
serves the deterministic tools the reference's online tests need (echo a token, hand out a nonce, record a
value, a slow tool, a destructive one) and records every call it receives, so tests assert on what reached
the server, not on what the agent says it did. The agent's tool surface takes the tools over MCP, the
scripted model is Codex's provider, and an AgentRunner holds a CodexAgent driving the real Codex CLI, whose
per-run homes live under the test's own folder.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from support.recording import TestTool, recording_server, turn_checkpoint

from unit_mcp import Host, UnitService
from unit_mcp.agent import (
    Agent,
    AgentApprovals,
    AgentRegistry,
    AgentRunner,
    AgentToolSurface,
    McpToolSource,
    SessionStore,
)
from unit_mcp.agent.codex import CodexModel, register
from unit_mcp.agent.items import Session
from unit_mcp.bridge import Bridge
from unit_mcp.testing import ScriptedModel, Step
from unit_mcp.tools import UnitTools

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_UNITS = REPO / "unit_mcp" / "examples" / "units"
MODEL = "scripted-codex"  # the fixed model of this suite, recorded on every assistant message
SERVER = "unit-agent"  # the endpoint's name in Codex's config
NAMESPACE = "mcp__unit_agent"  # how Codex groups that server's tools for the model
NONCE = "nonce-c0dex7"
TURN_TIMEOUT = 30
AGENT_ID = "codex-agent"


def record(server: UnitServer, name: str, arguments: dict[str, Any]) -> None:
    """A call the agent made (the runner's own checkpoint at the start of a turn left out)."""
    if not turn_checkpoint(name, arguments):
        server.calls.append((name, arguments))


@dataclass
class UnitServer:
    """The real unit server with the test tools: every call it received, and what became of slow calls."""

    bridge: Bridge
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    slow: list[str] = field(default_factory=list)
    slow_started: anyio.Event = field(default_factory=anyio.Event)

    def called(self) -> list[str]:
        return [name for name, _ in self.calls]


def _test_tools(server: UnitServer) -> dict[str, TestTool]:
    async def slow_echo(args: dict[str, Any]) -> str:
        server.slow.append("started")
        server.slow_started.set()
        try:
            await anyio.sleep(float(args.get("seconds", 30)))
        except anyio.get_cancelled_exc_class():
            server.slow.append("cancelled")
            raise
        server.slow.append("finished")
        return "slept"

    def text(properties: dict[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
        return {"type": "object", "properties": properties, "required": list(required)}

    string = {"type": "string"}
    return {
        "echo_token": TestTool("normal", text({"token": string}, ["token"]), lambda args: str(args["token"])),
        "get_nonce": TestTool("normal", text({}), lambda args: json.dumps({"nonce": NONCE})),
        "record_value": TestTool(
            "normal", text({"value": string}, ["value"]), lambda args: f"recorded:{args['value']}"
        ),
        "slow_echo": TestTool("normal", text({"seconds": {"type": "number"}}), slow_echo),
        "wipe_units": TestTool("destructive", text({}), lambda args: "wiped"),
    }


@dataclass
class Stack:
    tmp: Path
    runner: AgentRunner
    surface: AgentToolSurface
    model: ScriptedModel
    server: UnitServer

    async def new_session(self, agent_id: str = AGENT_ID) -> Session:
        return await self.runner.create_session(agent_id, title="codex e2e")

    def workspace(self) -> Path:
        """Where the Codex agent makes each run's private home (empty between runs)."""
        return self.tmp / "codex-runs"


def reload(tmp: Path, session_id: str) -> Session:
    """The session as a fresh store loads it from disk (with its load-time repair), after the runner closed."""
    store = SessionStore(tmp / "sessions")
    try:
        return store.require(session_id)
    finally:
        store.close()


def codex_options(binary: Path, tmp: Path, **options: Any) -> dict[str, Any]:
    """The suite's Codex agent configuration: its binary, turn timeout, and per-run homes under `tmp`."""
    return {"binary": binary, "workspace": tmp / "codex-runs", "turn_timeout": TURN_TIMEOUT, **options}


def codex_model(model: ScriptedModel) -> CodexModel:
    """The suite's fixed model, at the scripted model's Responses API."""
    return CodexModel(name=MODEL, base_url=model.base_url, stream_idle_timeout=10)


@asynccontextmanager
async def codex_stack(
    tmp: Path,
    binary: Path,
    steps: Sequence[Step],
    *,
    approvals: AgentApprovals | None = None,
    agent_options: Mapping[str, Any] | None = None,
    more_agents: Mapping[str, Callable[[ScriptedModel], Agent]] | None = None,
) -> AsyncIterator[Stack]:
    surface = AgentToolSurface(approvals or AgentApprovals())
    units = tmp / "units"
    shutil.copytree(EXAMPLE_UNITS, units, ignore=shutil.ignore_patterns("__pycache__"))
    async with AsyncExitStack() as stack:
        host = stack.enter_context(Host(units, tmp / "host-data", namespace=f"cx_units_{secrets.token_hex(4)}"))
        unit_tools = UnitTools(UnitService(host, test_timeout=30))
        server = UnitServer(bridge=None)  # type: ignore[arg-type]
        server.bridge = await stack.enter_async_context(
            Bridge(
                recording_server(unit_tools, _test_tools(server), lambda name, args: record(server, name, args)),
                config_root=tmp / "unit-opencode",
            )
        )
        assert server.bridge.url is not None
        surface.add_source(
            await stack.enter_async_context(McpToolSource(server.bridge.url, token=server.bridge.token, name="units"))
        )
        model = await stack.enter_async_context(ScriptedModel(steps, log_path=tmp / "model-requests.jsonl"))
        registry = AgentRegistry()
        options = codex_options(binary, tmp, **(agent_options or {}))
        register(registry, model=options.pop("model", codex_model(model)), id=AGENT_ID, **options)
        for agent_id, build in (more_agents or {}).items():
            registry.register(agent_id, lambda deps, build=build: build(model))
        runner = await stack.enter_async_context(
            AgentRunner(store=tmp / "sessions", registry=registry, tools=surface, cancel_timeout=15)
        )
        yield Stack(tmp, runner, surface, model, server)


def codex_pids(workspace: Path) -> list[int]:
    """Live Codex processes whose CODEX_HOME is under `workspace` (read from /proc, like `ps e`)."""
    marker = f"CODEX_HOME={workspace}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            status = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if marker in environ and status.rsplit(")", 1)[1].split()[0] != "Z":
            found.append(int(entry))
    return found
