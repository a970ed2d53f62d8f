"""The whole stack a OpenCodeAgent test needs, every part real, in one fresh isolated root per test.

The real unit server (Host + UnitTools + Bridge over loopback HTTP on a copy of the example units), a
tool surface taking its tools over MCP plus local test tools (echo a token, hand out a nonce, record a
value, a slow tool, a destructive one), the approval-filtered endpoint OpenCode is configured with, the
scripted model as OpenCode's provider, one or more real `opencode serve` nodes, their clients, and an
AgentRunner with a OpenCodeAgent per node. Local tools record their calls, so tests assert on what reached
the tools, not on what the agent says it did.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from unit_mcp import Host, UnitService
from unit_mcp.agent import AgentApprovals, AgentRegistry, AgentRunner, AgentToolSurface, McpToolSource
from unit_mcp.agent.items import Session
from unit_mcp.agent.opencode import (
    IsolatedRoot,
    NodeProcess,
    OpenCodeAgent,
    OpenCodeClient,
    OpenCodeEndpoint,
    opencode_endpoint,
    opencode_tool_name,
)
from unit_mcp.agent.presets import PresetManager
from unit_mcp.agent.sessions import SessionStore
from unit_mcp.bridge import Bridge
from unit_mcp.testing import Match, ScriptedModel, Step, say
from unit_mcp.tools import UnitTools

from .event_proxy import EventProxy

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_UNITS = REPO / "unit_mcp" / "examples" / "units"
SERVER = "unit-agent"  # the endpoint's name in OpenCode's config: its tools reach the model as unit-agent_<tool>
MODEL = "scripted/m"
NONCE = "nonce-5c1e07"
TURN_TIMEOUT = 60


def oc(tool: str, server: str = SERVER) -> str:
    """A tool's name as OpenCode offers it to the model."""
    return opencode_tool_name(server, tool)


def documented_provider() -> dict[str, Any]:
    """The OpenCode config for the scripted model that docs/agent.md shows (`provider.scripted`): the one source of
    what these tests give OpenCode, so the page shows what is tested."""
    text = (REPO / "docs" / "agent.md").read_text(encoding="utf-8")
    for block in re.findall(r"^```json\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        config = json.loads(block)
        if isinstance(config, dict) and "scripted" in config.get("provider", {}):
            return dict(config)
    raise AssertionError("docs/agent.md shows no OpenCode provider for the scripted model (provider.scripted)")


def scripted_provider(base_url: str) -> dict[str, Any]:
    """OpenCode config adding only the scripted model as a provider (no permissions, no MCP servers): the one
    docs/agent.md shows, with this run's `base_url` for its placeholder."""
    config = documented_provider()
    config["provider"]["scripted"]["options"]["baseURL"] = base_url
    return config


def title_step() -> Step:
    """OpenCode may ask its small model for a session title; the script answers that whenever it comes."""
    return say("Unit work", when=Match(system_contains="title generator"), repeat=True, label="title")


@dataclass
class Recorder:
    """What the local test tools saw: every call in order, and what became of each slow call."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    slow: list[str] = field(default_factory=list)
    slow_started: anyio.Event = field(default_factory=anyio.Event)

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def add_test_tools(surface: AgentToolSurface, recorder: Recorder) -> None:
    @surface.tool(risk="normal")
    def echo_token(token: str) -> str:
        """Return the token unchanged."""
        recorder.calls.append(("echo_token", {"token": token}))
        return token

    @surface.tool(risk="normal")
    def get_nonce() -> str:
        """Hand out this run's nonce as JSON."""
        recorder.calls.append(("get_nonce", {}))
        return json.dumps({"nonce": NONCE})

    @surface.tool(risk="normal")
    def record_value(value: str) -> str:
        """Record a value."""
        recorder.calls.append(("record_value", {"value": value}))
        return f"recorded:{value}"

    @surface.tool(risk="normal")
    async def slow_echo(seconds: float = 30.0) -> str:
        """Sleep, then say so (to cancel a turn while OpenCode waits on a tool)."""
        recorder.calls.append(("slow_echo", {"seconds": seconds}))
        recorder.slow.append("started")
        recorder.slow_started.set()
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            recorder.slow.append("cancelled")
            raise
        recorder.slow.append("finished")
        return "slept"

    @surface.tool(risk="destructive")
    def wipe_units() -> str:
        """Delete every unit (never approved in these tests)."""
        recorder.calls.append(("wipe_units", {}))
        return "wiped"


@dataclass
class Node:
    """One OpenCode node of the stack: its process, client, endpoint and the agent id that drives it."""

    agent_id: str
    process: NodeProcess
    client: OpenCodeClient
    endpoint: OpenCodeEndpoint
    root: IsolatedRoot
    proxy: EventProxy | None = None


@dataclass
class Stack:
    tmp: Path
    runner: AgentRunner
    surface: AgentToolSurface
    approvals: AgentApprovals
    model: ScriptedModel
    nodes: list[Node]
    recorder: Recorder
    units: Path

    @property
    def node(self) -> Node:
        return self.nodes[0]

    async def new_session(self, agent_id: str | None = None) -> Session:
        return await self.runner.create_session(agent_id or self.node.agent_id, title="e2e")

    def reload(self, session_id: str) -> Session:
        """The session as a fresh store loads it (with its load-time repair): a copy of it as stored, loaded by a
        store of its own while the runner's store still holds the original."""
        copy = self.tmp / "sessions-copy"
        shutil.rmtree(copy, ignore_errors=True)
        reader, store = SessionStore(self.tmp / "sessions", read_only=True), SessionStore(copy)
        try:
            store.save(reader.require(session_id))
            store.invalidate(session_id)
            return store.require(session_id)
        finally:
            store.close()
            reader.close()


@asynccontextmanager
async def agent_stack(
    tmp: Path,
    binary: Path,
    steps: Sequence[Step],
    *,
    approvals: AgentApprovals | None = None,
    nodes: int = 1,
    settle_timeout: float = 8.0,
    client_options: dict[str, Any] | None = None,
    proxied: bool = False,
    presets: PresetManager | None = None,
) -> AsyncIterator[Stack]:
    """`proxied` puts an `EventProxy` between each node and its client (to break the event stream)."""
    approvals = approvals or AgentApprovals()
    surface = AgentToolSurface(approvals, presets=presets)
    recorder = Recorder()
    add_test_tools(surface, recorder)
    units = tmp / "units"
    shutil.copytree(EXAMPLE_UNITS, units, ignore=shutil.ignore_patterns("__pycache__"))
    async with AsyncExitStack() as stack:
        host = stack.enter_context(Host(units, tmp / "host-data", namespace=f"oc_units_{secrets.token_hex(4)}"))
        bridge = await stack.enter_async_context(
            Bridge(UnitTools(UnitService(host, test_timeout=30)).server(), config_root=tmp / "unit-opencode")
        )
        assert bridge.url is not None
        source = await stack.enter_async_context(McpToolSource(bridge.url, token=bridge.token, name="units"))
        surface.add_source(source)
        model = await stack.enter_async_context(
            ScriptedModel([title_step(), *steps], log_path=tmp / "model-requests.jsonl")
        )
        built: list[Node] = []
        for index in range(nodes):
            root = IsolatedRoot(tmp / f"node-{index}")
            endpoint = await stack.enter_async_context(
                opencode_endpoint(surface, server_name=SERVER, config_root=root.config_home)
            )
            root.add_config(scripted_provider(model.base_url))
            process = NodeProcess(binary=binary, root=root)
            stack.push_async_callback(process.stop)
            built.append(Node(f"unit-agent-{index}", process, None, endpoint, root))  # type: ignore[arg-type]
        async with anyio.create_task_group() as tg:  # the nodes start side by side (~4 s each)
            for node in built:
                tg.start_soon(node.process.start)
        for node in built:
            if proxied:
                assert node.process.port is not None
                node.proxy = await stack.enter_async_context(EventProxy(node.process.port))
                client = OpenCodeClient(node.proxy.url, password=node.process.password, **(client_options or {}))
            else:
                client = node.process.client(**(client_options or {}))
            node.client = await stack.enter_async_context(client)
        registry = AgentRegistry()
        for node in built:
            registry.register(
                node.agent_id,
                lambda deps, node=node: OpenCodeAgent(
                    node.client,
                    model=MODEL,
                    endpoint=node.endpoint,
                    id=node.agent_id,
                    turn_timeout=TURN_TIMEOUT,
                    settle_timeout=settle_timeout,
                ),
            )
        runner = await stack.enter_async_context(
            AgentRunner(store=tmp / "sessions", registry=registry, tools=surface, cancel_timeout=settle_timeout + 7)
        )
        yield Stack(tmp, runner, surface, approvals, model, built, recorder, units)
        for node in built:  # OpenCode installs its plugin SDK into a config folder unless told it is there
            installed = sorted(path.name for path in (node.root.workdir / "node_modules").iterdir())
            assert not installed, f"node {node.agent_id} installed npm packages in its config folder: {installed}"
