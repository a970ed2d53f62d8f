"""The fleet's MCP server: `fleet_*` tools for a master agent, the operating protocol in its instructions.

Each tool has a pydantic argument model (its input schema, ranges included, and the one validation of a call),
a result model (its output schema and structured content) and a risk label in `_meta` like the unit tools. A
refusal the master can act on (an unknown node or session, no session yet, a busy session to reset) and a node
that does not answer come back as `isError` results saying what to do, their code in `_meta` as well; nothing a
node does can crash the server.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from pydantic import BaseModel, ConfigDict, Field

from .. import tracing
from .._version import __version__
from ..agent.opencode import OpenCodeError
from ..agent.toolsurface import ToolOutput
from ..tooldecl import Refusal, ToolDecl
from ..wire import ERROR_META_KEY
from .nodes import (
    Dispatched,
    Fleet,
    FleetError,
    Health,
    Interrupted,
    Messages,
    ModelList,
    NodeList,
    Reset,
    SessionList,
    SessionStatus,
)

log = logging.getLogger("unit_mcp.fleet")

INSTRUCTIONS = """\
You coordinate a fleet of OpenCode nodes (slaves). Each node works on its own, in one working session.

fleet_send_message is fire-and-forget: it dispatches a prompt to a node and returns at once with the session
id; the node works in the background. Never wait on one node: dispatch to every node that has work, then poll.

The standard workflow for any task:
1. Dispatch: fleet_send_message for each node (returns at once).
2. Poll: fleet_get_session_status for each node until its status is idle.
3. Retrieve: fleet_get_session_messages to read what the node did and answered.

Before the first dispatch to a node, call fleet_node_health: it says whether the node is up and what it may do
(its resolved permission rules and MCP servers); include_capabilities=false is a quick ping. A rule that asks
blocks a headless node, so do not give it work that needs one. fleet_list_nodes names the nodes and says which
would block on a question;
fleet_list_models lists the models a node can use (pass one as `model` to fleet_send_message).

To stop a running task but keep its session: fleet_interrupt_session. If you lost track of a session (e.g. after
a restart): fleet_list_sessions, then pass its session_id. fleet_reset_session discards the working session so
the next message starts a fresh one: a last resort, only when the session is idle (interrupt first)."""


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


_NODE = Field(description="The node's name, as fleet_list_nodes gives it.")
_SESSION = Field(None, description="A session id from fleet_list_sessions; default: the node's working session.")


class NoArgs(_Args):
    pass


class NodeArgs(_Args):
    node: str = _NODE


class HealthArgs(_Args):
    node: str = _NODE
    include_capabilities: bool = Field(True, description="Also read the node's permission rules and MCP servers.")


class SendArgs(_Args):
    node: str = _NODE
    message: str = Field(description="The task for the node, complete in itself: the node sees nothing else.")
    model: str | None = Field(None, description="provider/model from fleet_list_models; default: the node's own.")
    new_session: bool = Field(False, description="Start a fresh working session instead of continuing the current.")


class SessionArgs(_Args):
    node: str = _NODE
    session_id: str | None = _SESSION


class MessagesArgs(_Args):
    node: str = _NODE
    session_id: str | None = _SESSION
    limit: int = Field(10, ge=1, le=100, description="How many of the newest messages to return, oldest first.")


class ResetArgs(_Args):
    node: str = _NODE
    delete: bool = Field(False, description="Also delete the old session on the node (its history is lost).")


Handler = Callable[[Fleet, Any], Awaitable[BaseModel] | BaseModel]


@dataclass(frozen=True)
class FleetTool(ToolDecl):
    """A fleet tool: its handler runs on the entered `Fleet`. Read-only and idempotent unless it says otherwise;
    open-world, since a node may do anything its rules allow."""

    result: type[BaseModel] = field()  # required here (the base's default is None)
    handler: Handler
    _: KW_ONLY
    read_only: bool | None = True
    destructive: bool | None = False
    idempotent: bool | None = True
    open_world: bool | None = True


TOOLS = [
    FleetTool(
        "fleet_list_nodes",
        "List the fleet's nodes",
        "The nodes of the fleet: name, URL, whether their event stream is connected, their working session, and "
        "their permission mode in one line (a node that would block on a question must not get work needing one).",
        NoArgs,
        NodeList,
        lambda fleet, args: fleet.list_nodes(),
    ),
    FleetTool(
        "fleet_node_health",
        "Check a node",
        "Whether a node is up, and (by default) a summary of what it may do: its resolved permission rules, its "
        "MCP servers and its model. Call it before the first dispatch to a node. Creates no session.",
        HealthArgs,
        Health,
        lambda fleet, args: fleet.health(args.node, include_capabilities=args.include_capabilities),
    ),
    FleetTool(
        "fleet_send_message",
        "Dispatch a task to a node",
        "Send a prompt to a node's working session (created on first use) and return at once with the session "
        "id: the node works in the background. Then poll fleet_get_session_status until idle and read the "
        "answer with fleet_get_session_messages. Risk shell: the node may run anything its own permission rules "
        "allow (commands, edits, its MCP servers), so read them with fleet_node_health first.",
        SendArgs,
        Dispatched,
        lambda fleet, args: fleet.send(args.node, args.message, model=args.model, new_session=args.new_session),
        risk="shell",
        read_only=False,
        idempotent=False,
    ),
    FleetTool(
        "fleet_get_session_status",
        "Is the node done?",
        "The status of a node's session (idle, busy or retry): from the live event stream for a session the "
        "fleet dispatched, else asked of the node; an id the node does not know is refused. Idle means the task "
        "is finished (or was interrupted).",
        SessionArgs,
        SessionStatus,
        lambda fleet, args: fleet.status(args.node, args.session_id),
    ),
    FleetTool(
        "fleet_get_session_messages",
        "Read a node's session",
        "The newest messages of a node's session, oldest first: each with its role, text, the tools it ran "
        "(input, output, status) and any error.",
        MessagesArgs,
        Messages,
        lambda fleet, args: fleet.messages(args.node, args.session_id, limit=args.limit),
    ),
    FleetTool(
        "fleet_interrupt_session",
        "Stop a node's task",
        "Abort what a node's session is doing; the session and its history stay.",
        SessionArgs,
        Interrupted,
        lambda fleet, args: fleet.interrupt(args.node, args.session_id),
        read_only=False,
        idempotent=False,
    ),
    FleetTool(
        "fleet_list_sessions",
        "List a node's sessions",
        "Every session on a node with its status, marking the fleet's working session (to find a session "
        "again after a restart).",
        NodeArgs,
        SessionList,
        lambda fleet, args: fleet.list_sessions(args.node),
    ),
    FleetTool(
        "fleet_reset_session",
        "Start a node afresh",
        "Forget the node's working session so the next message starts a new one. Only when the session is "
        "idle: interrupt it first. With delete=true the old session is deleted on the node too.",
        ResetArgs,
        Reset,
        lambda fleet, args: fleet.reset(args.node, delete=args.delete),
        risk="destructive",
        read_only=False,
        idempotent=False,
        destructive=True,
    ),
    FleetTool(
        "fleet_list_models",
        "List a node's models",
        "The models a node can use (provider/model), marking its default.",
        NodeArgs,
        ModelList,
        lambda fleet, args: fleet.models(args.node),
    ),
]


class FleetTools:
    """The tools over one entered `Fleet`; `server()` builds a low-level MCP server for stdio or the bridge."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.specs = {tool.name: tool for tool in TOOLS}

    def definitions(self) -> list[types.Tool]:
        return [tool.mcp_tool() for tool in TOOLS]

    def server(self, name: str = "opencode-fleet") -> Server[Any]:
        return Server(
            name,
            version=__version__,
            title="OpenCode fleet",
            instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.definitions())

    async def call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        tool = self.specs.get(name)
        if tool is None:
            return _error("unknown_tool", f"no fleet tool named {name!r}; use one of: {', '.join(self.specs)}")
        args = tool.validate(arguments)
        if isinstance(args, Refusal):
            return _error(args.code, args.message)
        with tracing.span(f"fleet {name}", {"unit_mcp.tool": name, "unit_mcp.fleet.node": getattr(args, "node", None)}):
            try:
                outcome = tool.handler(self.fleet, args)
                result = await outcome if isinstance(outcome, Awaitable) else outcome
            except FleetError as exc:
                tracing.fail(tracing.current(), exc.code)
                return _error(exc.code, str(exc))
            except OpenCodeError as exc:
                tracing.fail(tracing.current(), "node_error")
                return _error("node_error", str(exc))
            except Exception as exc:
                log.exception("fleet tool %s failed", name)
                tracing.fail(tracing.current(), "internal_error")
                return _error("internal_error", f"{name} failed: {type(exc).__name__}: {exc}")
        structured = result.model_dump(mode="json")
        return ToolOutput(text=json.dumps(structured, ensure_ascii=False), structured=structured).call_result()

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return await self.call(params.name, dict(params.arguments or {}))


def _error(code: str, message: str) -> types.CallToolResult:
    """The one place a fleet refusal becomes a wire result: `[code] message`, the two fields in `_meta` too."""
    meta = {ERROR_META_KEY: {"code": code, "message": message}}
    return ToolOutput(text=f"[{code}] {message}", is_error=True, meta=meta).call_result()
