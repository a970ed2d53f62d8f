"""ApprovedEndpoint: a loopback MCP server exposing only the tools the approval policy allows right now.

Provider-side tool callers (OpenCode, Codex) never see the unit server: they get this endpoint, which lists the
surface's risk-filtered tools (its `view`), checks the policy again on every call, and tells connected clients
when the list changes. It is served by the bridge's `McpHttpServer` and writes an isolated `opencode.json`.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, cast

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.requests import Request
from typing_extensions import TypeVar

from ..bridge import Bridge, BridgeStatus
from ..mcphttp import DEFAULT_LIMITS, Limits
from .errors import EndpointError, ToolFailed
from .toolsurface import AgentToolSurface, ToolOutput

log = logging.getLogger("unit_mcp.agent.endpoint")

_MAX_TRACKED_MCP_SESSIONS = 256


@dataclass(frozen=True)
class EndpointStatus(BridgeStatus):
    """The bridge's status and the names of the tools the endpoint offers now."""

    tools: list[str] = field(default_factory=list)


class _ListChangedServer(Server[Any]):
    """A low-level server that advertises `tools.listChanged` to handshake-era clients too."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True), experimental_capabilities, extensions
        )


class ToolView(Protocol):
    def tool_defs(self) -> list[types.Tool]: ...

    async def run(self, name: str, arguments: dict[str, Any]) -> ToolOutput: ...


@dataclass
class ApprovedTools:
    """What the policy and `grants` allow outright, under the surface's names."""

    surface: AgentToolSurface
    grants: Sequence[str] = ()

    def tool_defs(self) -> list[types.Tool]:
        return self.surface.mcp_tool_defs(self.grants)

    async def run(self, name: str, arguments: dict[str, Any]) -> ToolOutput:
        return await self.surface.call(name, arguments, grants=self.grants)


V = TypeVar("V", bound=ToolView, default=ApprovedTools)


class ApprovedEndpoint(Generic[V]):
    def __init__(
        self,
        surface: AgentToolSurface,
        *,
        view: V | None = None,
        server_name: str = "unit-agent",
        host: str = "127.0.0.1",
        port: int = 0,
        config_root: str | os.PathLike[str] | None = None,
        auth: bool = True,
        grants: Iterable[str] = (),
        config_extra: Mapping[str, Any] | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        """`view` defaults to `ApprovedTools` with `grants` (on top of the policy's `auto` risks); `config_root`
        defaults to a temporary folder removed at stop; `limits` bound what one client can hold."""
        self.surface = surface
        self.approvals = surface.approvals
        self.server_name = server_name
        self.host = host
        self.port = port
        self.auth = auth
        self.limits = limits
        self.view = cast(V, view if view is not None else ApprovedTools(surface, list(grants)))
        self.config_extra = dict(config_extra or {})
        self.config_root = config_root
        self._bridge: Bridge | None = None
        self._stack: AsyncExitStack | None = None
        self._bus = InMemorySubscriptionBus()
        self._mcp_sessions: OrderedDict[Any, ServerSession] = OrderedDict()
        self._listed = self._signature()
        self._wake = anyio.Event()
        self._unsubscribe = [self.approvals.on_change(self._changed), surface.on_change(self._changed)]

    # -- the MCP server ---------------------------------------------------------------------------

    def tool_defs(self) -> list[types.Tool]:
        return self.view.tool_defs()

    def server(self) -> Server[Any]:
        """A fresh low-level server (a session manager runs once per server); in-memory tests use it directly."""
        return _ListChangedServer(
            self.server_name,
            title="Approved agent tools",
            instructions=self._instructions(),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=ListenHandler(self._bus),
        )

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            self._track(ctx)
        return types.ListToolsResult(tools=self.tool_defs())

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if params.name not in {tool.name for tool in self.tool_defs()}:
            return ToolOutput(
                text=f"[not_available] {params.name} is not an approved tool.", is_error=True
            ).call_result()
        try:
            output = await self.view.run(params.name, dict(params.arguments or {}))
        except ToolFailed as exc:
            output = ToolOutput(text=str(exc), is_error=True)
        return output.call_result()

    def _instructions(self) -> str | None:
        fragments = [fragment.text for fragment in self.surface.prompt_fragments()]
        return "\n\n".join(fragments) or None

    def _track(self, ctx: ServerRequestContext[Any]) -> None:
        """Remember handshake-era MCP client sessions, which get change notifications on their standalone stream."""
        key: Any = ctx.request.headers.get("mcp-session-id") if isinstance(ctx.request, Request) else None
        if key is None:
            key = id(ctx.session.client_params) if ctx.session.client_params is not None else id(ctx.session)
        self._mcp_sessions[key] = ctx.session
        self._mcp_sessions.move_to_end(key)
        while len(self._mcp_sessions) > _MAX_TRACKED_MCP_SESSIONS:
            self._mcp_sessions.popitem(last=False)

    # -- change propagation -----------------------------------------------------------------------

    def _signature(self) -> list[dict[str, Any]]:
        return [tool.model_dump(by_alias=True, mode="json") for tool in self.tool_defs()]

    def _changed(self) -> None:
        self._wake.set()

    async def resync(self) -> bool:
        """If the approved tool list changed since it was last announced, tell every connected client."""
        signature = self._signature()
        if signature == self._listed:
            return False
        self._listed = signature
        for mcp_session in list(self._mcp_sessions.values()):
            try:
                await mcp_session.send_tool_list_changed()
            except Exception:
                log.debug("an MCP client session could not be notified of the tool-list change", exc_info=True)
        await self._bus.publish(ToolsListChanged())
        return True

    async def _resync_forever(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            try:
                await self.resync()
            except Exception:
                log.exception("resyncing the approved tool list failed")

    # -- serving ----------------------------------------------------------------------------------

    @property
    def token(self) -> str | None:
        return None if self._bridge is None else self._bridge.token

    @property
    def url(self) -> str | None:
        return None if self._bridge is None else self._bridge.url

    @property
    def sse_url(self) -> str | None:
        return None if self._bridge is None else self._bridge.sse_url

    @property
    def config_path(self) -> Path | None:
        return None if self._bridge is None else self._bridge.config_path

    def status(self) -> EndpointStatus:
        served = self._bridge.status() if self._bridge else BridgeStatus(False, self.host, None, None, None, None, None)
        return EndpointStatus(**asdict(served), tools=[tool.name for tool in self.tool_defs()])

    def opencode_env(self) -> dict[str, str]:
        """What an OpenCode process needs to see only this endpoint: its own XDG_CONFIG_HOME."""
        if self._bridge is None:
            raise EndpointError("the endpoint is not started")
        return self._bridge.opencode_env()

    async def __aenter__(self) -> ApprovedEndpoint[V]:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> EndpointStatus:
        """Serve on loopback and write the isolated OpenCode config (the bridge's server, with this endpoint's
        error type); start and stop in the same task."""
        if self._stack is not None:
            return self.status()
        stack = AsyncExitStack()
        try:
            bridge = Bridge(
                self.server(),
                host=self.host,
                port=self.port,
                server_name=self.server_name,
                config_root=self.config_root,
                auth=self.auth,
                limits=self.limits,
                config_extra=self.config_extra,
                config_prefix="unit-mcp-agent-opencode-",
                error=EndpointError,
            )
            stack.push_async_callback(bridge.stop)
            self._listed = self._signature()
            await bridge.start()
            self._bridge = bridge
            tg = await stack.enter_async_context(anyio.create_task_group())
            tg.start_soon(self._resync_forever)
            stack.callback(tg.cancel_scope.cancel)
        except BaseException:
            await stack.aclose()
            self._bridge = None
            raise
        self._stack = stack
        return self.status()

    async def stop(self) -> None:
        stack, self._stack = self._stack, None
        try:
            if stack is not None:
                await stack.aclose()
        finally:
            self._bridge = None

    def close(self) -> None:
        """Stop listening to policy and surface changes (the endpoint object is done for good)."""
        for unsubscribe in self._unsubscribe:
            unsubscribe()
