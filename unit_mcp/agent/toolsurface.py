"""AgentToolSurface: the one list of tools every provider sees (MCP sources' and local functions'), offered as
MCP definitions or OpenAI functions as far as the approval policy allows, and checked again on every call.
A refusal the model can act on is an error `ToolOutput`; a crash raises `ToolFailed` (docs/agent.md, Tools)."""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, get_type_hints

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, Field, create_model

from .. import tracing
from ..tooldecl import Refusal, ToolDecl, mcp_tool_definition
from ..wire import DRY_RUN_RISK_META_KEY, RISK_META_KEY, RISKS, call_risk
from ._listeners import ChangeListener, Listeners
from ._mcpsource import McpToolSource
from .approvals import AgentApprovals, Risk, normalise_risk
from .errors import AgentError, ToolError, ToolFailed
from .items import EventItem
from .presets import ACTIVATE, DEACTIVATE, PresetError, PresetInfo, PresetManager
from .toolnames import openai_tool_name
from .turns import describe

if TYPE_CHECKING:
    from ._turnapprovals import TurnApprovals
    from .turns import TurnController


class CallContext(Protocol):
    """What a tool call needs of the turn (a `TurnContext` is one): its approvals and its items. A local
    tool with a `ctx` parameter receives the whole context."""

    @property
    def turn(self) -> TurnController: ...

    @property
    def approvals(self) -> TurnApprovals: ...


log = logging.getLogger("unit_mcp.agent.toolsurface")

LOCAL = "local"


class ToolDef(BaseModel):
    """A tool as the surface knows it: its external (model-facing) name, schemas, risk and origin."""

    name: str
    upstream_name: str
    source: str
    risk: Risk
    dry_run_risk: Risk | None = None
    """The risk of a call with dry_run=true, when the tool publishes a lower one (see `wire.call_risk`)."""
    description: str = ""
    title: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    output_schema: dict[str, Any] | None = None
    annotations: dict[str, Any] | None = None

    @property
    def least_risk(self) -> Risk:
        """The lowest risk a call of this tool can have: what offering it needs (each call is checked again)."""
        return min(filter(None, (self.risk, self.dry_run_risk)), key=RISKS.index)


_LISTED = {"name", "title", "description", "input_schema", "output_schema"}
"""The fields of a `ToolDef` an MCP client is shown as they are (its annotations and risk are rendered)."""


class ToolOutput(BaseModel):
    """What a tool call gives back to the model: text, an error flag, structured content if any, and the MCP
    result's `_meta` (a unit-mcp server's tool error carries its code and hint there), passed on as it came."""

    text: str
    is_error: bool = False
    structured: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None

    def call_result(self) -> types.CallToolResult:
        """The MCP result an endpoint answers with (the one place this conversion is written)."""
        text = types.TextContent(type="text", text=self.text)
        return types.CallToolResult(
            content=[text], structured_content=self.structured, is_error=self.is_error, _meta=self.meta
        )


class PromptFragment(BaseModel):
    """Guidance a tool source wants in the system prompt (an MCP server's instructions, a local tool's note)."""

    source: str
    text: str


class _StrictArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _PresetArgs(_StrictArgs):
    name: str = Field(description="the preset's name, as the list of capabilities gives it")


class _ActivateArgs(_PresetArgs):
    reason: str = Field("", max_length=500, description="why the task needs it (the user sees it when asked)")


@dataclass(frozen=True, kw_only=True)
class LocalTool(ToolDecl):
    """A Python function offered as a tool. `fn` gets the validated argument model (or its fields as keyword
    arguments when `spread`), plus `ctx=` when `needs_context`. Sync functions run in a worker thread."""

    title: str | None = None
    description: str = ""
    fn: Callable[..., Any]
    prompt: str | None = None
    spread: bool = False
    needs_context: bool = False
    risk_for: Callable[[dict[str, Any]], str] | None = None  # a call's risk when it depends on its arguments

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        risk: str = "normal",
        description: str | None = None,
        prompt: str | None = None,
    ) -> LocalTool:
        """Build from a function's signature: one pydantic-model parameter, or plain typed parameters (a
        parameter named `ctx` receives the TurnContext)."""
        hints = get_type_hints(fn)
        params = [p for p in inspect.signature(fn).parameters.values() if p.name != "ctx"]
        needs_context = "ctx" in inspect.signature(fn).parameters
        tool_name = name or fn.__name__
        doc = description if description is not None else inspect.cleandoc(fn.__doc__ or "").split("\n\n")[0]
        hint = hints.get(params[0].name) if len(params) == 1 else None
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            model, spread = hint, False
        else:
            fields: dict[str, Any] = {
                p.name: (hints.get(p.name, Any), ... if p.default is inspect.Parameter.empty else p.default)
                for p in params
            }
            model, spread = create_model(f"{tool_name}_args", __base__=_StrictArgs, **fields), True
        return cls(
            tool_name,
            description=doc,
            args=model,
            fn=fn,
            risk=normalise_risk(risk),
            prompt=prompt,
            spread=spread,
            needs_context=needs_context,
        )

    def definition(self) -> ToolDef:
        return _definition(self.mcp_tool(), LOCAL)


def _output(value: Any) -> ToolOutput:
    if isinstance(value, ToolOutput):
        return value
    if isinstance(value, str):
        return ToolOutput(text=value)
    if isinstance(value, BaseModel):
        structured = value.model_dump(mode="json")
        return ToolOutput(text=json.dumps(structured, ensure_ascii=False), structured=structured)
    if isinstance(value, dict):
        return ToolOutput(text=json.dumps(value, ensure_ascii=False, default=str), structured=value)
    return ToolOutput(text="" if value is None else json.dumps(value, ensure_ascii=False, default=str))


def _mcp_output(result: types.CallToolResult) -> ToolOutput:
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        else:
            parts.append(f"[{block.type} content]")
    structured = result.structured_content
    text = "\n".join(parts) if parts else json.dumps(structured or {}, ensure_ascii=False)
    return ToolOutput(text=text, is_error=bool(result.is_error), structured=structured, meta=result.meta)


class AgentToolSurface:
    def __init__(
        self,
        approvals: AgentApprovals,
        *,
        local: Iterable[LocalTool] = (),
        sources: Iterable[McpToolSource] = (),
        presets: PresetManager | None = None,
    ) -> None:
        self.approvals = approvals
        self.presets = presets
        self._local: dict[str, LocalTool] = {}
        self._sources: dict[str, McpToolSource] = {}
        self._unsubscribe: dict[str, Callable[[], None]] = {}
        self._listeners = Listeners("tool surface")
        self._registered: list[ToolDef] | None = None  # built on demand, dropped on every change
        if presets is not None:
            presets.on_change(self._listeners.notify)
            self._add_preset_tools()
        for tool in local:
            self.add_local(tool)
        for source in sources:
            self.add_source(source)

    # -- registration -----------------------------------------------------------------------------

    def add_local(self, tool: LocalTool) -> LocalTool:
        if tool.name in self._local:
            raise AgentError(f"a local tool named {tool.name!r} is already registered")
        self._local[tool.name] = tool
        self._changed()
        return tool

    def tool(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        risk: str = "normal",
        description: str | None = None,
        prompt: str | None = None,
    ) -> Any:
        """Decorator registering a function as a local tool: `@surface.tool(risk="shell")`."""

        def register(function: Callable[..., Any]) -> Callable[..., Any]:
            self.add_local(
                LocalTool.from_function(function, name=name, risk=risk, description=description, prompt=prompt)
            )
            return function

        return register(fn) if fn is not None else register

    def remove_local(self, name: str) -> bool:
        removed = self._local.pop(name, None) is not None
        if removed:
            self._changed()
        return removed

    def add_source(self, source: McpToolSource) -> None:
        """Take tools from a connected MCP source; its tool-list changes propagate to this surface's listeners."""
        if source.name in self._sources or source.name == LOCAL:
            raise AgentError(f"a tool source named {source.name!r} is already registered")
        self._sources[source.name] = source
        self._unsubscribe[source.name] = source.on_change(self._changed)
        self._changed()

    def sources_offering(self, upstream_name: str) -> list[McpToolSource]:
        """The MCP sources that list a tool of this name (e.g. every unit server: `unit_checkpoint`)."""
        return [s for s in self._sources.values() if any(t.name == upstream_name for t in s.tools)]

    def remove_source(self, name: str) -> bool:
        source = self._sources.pop(name, None)
        if source is None:
            return False
        self._unsubscribe.pop(name)()
        self._changed()
        return True

    def on_change(self, listener: ChangeListener) -> Callable[[], None]:
        return self._listeners.add(listener)

    def _changed(self) -> None:
        self._registered = None
        self._listeners.notify()

    # -- listing ----------------------------------------------------------------------------------

    def tools(self) -> list[ToolDef]:
        """The tools on offer, approved or not: every tool, or with presets those of the active ones."""
        registered = self.registered()
        if self.presets is None:
            return registered
        return [tool for tool in registered if self.presets.includes(tool.name)]

    def registered(self) -> list[ToolDef]:
        """Every tool, active preset or not; on a name clash the earlier registration wins (local tools first).
        Kept until a tool, a source or a source's tool list changes: a turn asks for it on every step."""
        if self._registered is None:
            self._registered = self._register()
        return list(self._registered)

    def _register(self) -> list[ToolDef]:
        found: dict[str, ToolDef] = {}
        for local in self._local.values():
            found[local.name] = local.definition()
        for source in self._sources.values():
            for tool in source.tools:
                definition = _definition(tool, source.name, source.prefix)
                if definition.name in found:
                    log.warning("tool %s of source %s hidden by an earlier tool of that name", tool.name, source.name)
                    continue
                found[definition.name] = definition
        return list(found.values())

    def get(self, name: str) -> ToolDef | None:
        """A tool by its name or by its OpenAI function name."""
        for tool in self.tools():
            if name in (tool.name, openai_tool_name(tool.name)):
                return tool
        return None

    def visible(self, grants: Iterable[str] = (), *, interactive: bool = False) -> list[ToolDef]:
        """The tools that may be offered: approved by policy or grant, or askable with an approver attached."""
        grants = list(grants)
        return [
            tool for tool in self.tools() if self.approvals.usable(tool.least_risk, grants, interactive=interactive)
        ]

    def mcp_tool_defs(self, grants: Iterable[str] = (), *, interactive: bool = False) -> list[types.Tool]:
        return [
            mcp_tool_definition(
                tool.risk, tool.dry_run_risk, **tool.model_dump(include=_LISTED), annotations=tool.annotations or None
            )
            for tool in self.visible(grants, interactive=interactive)
        ]

    def openai_tools(self, grants: Iterable[str] = (), *, interactive: bool = True) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": openai_tool_name(tool.name),
                    "description": tool.description,
                    "parameters": tool.input_schema,
                },
            }
            for tool in self.visible(grants, interactive=interactive)
        ]

    def preset_infos(self, *, active_only: bool = False) -> list[PresetInfo]:
        """Each preset with the tools it resolves to now and their highest risk (none without a manager)."""
        if self.presets is None:
            return []
        registered = self.registered()
        names = self.presets.active() if active_only else self.presets.names()
        return [self.presets.describe(registered, name) for name in names]

    def prompt_fragments(self) -> list[PromptFragment]:
        offered = {tool.name for tool in self.tools()}
        fragments = [
            PromptFragment(source=t.name, text=t.prompt) for t in self._local.values() if t.prompt and t.name in offered
        ]
        fragments += [
            PromptFragment(source=f"preset:{info.name}", text=info.prompt)
            for info in self.preset_infos(active_only=True)
            if info.prompt
        ]
        fragments += [
            PromptFragment(source=name, text=source.instructions)
            for name, source in self._sources.items()
            if source.instructions
        ]
        return fragments

    # -- calling ----------------------------------------------------------------------------------

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        ctx: CallContext | None = None,
        *,
        grants: Iterable[str] = (),
        call_id: str | None = None,
    ) -> ToolOutput:
        """Run a tool after checking approval: through `ctx` when given (policy, the session's grants, then the
        approver; `call_id` ties a request to the model's call), otherwise by the policy and `grants` alone."""
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.call.id": call_id}
        with tracing.span(f"execute_tool {name}", attributes) as span:
            tracing.set_content(span, "gen_ai.tool.call.arguments", arguments)
            output = await self._call(name, arguments, ctx, grants, call_id)
            tracing.set_content(span, "gen_ai.tool.call.result", output.text)
            if output.is_error:
                tracing.fail(span, "tool_error")
            return output

    async def _call(
        self,
        name: str,
        arguments: dict[str, Any],
        ctx: CallContext | None,
        grants: Iterable[str],
        call_id: str | None,
    ) -> ToolOutput:
        tool = self.get(name)
        owners = self.presets.owners(name) if self.presets is not None and tool is None else []
        if owners and any(t.name == name for t in self.registered()):
            return ToolOutput(
                text=f"[preset_inactive] {name} belongs to preset {' or '.join(owners)}, which is not active. "
                f"Call {ACTIVATE} with its name first if the task needs it.",
                is_error=True,
            )
        if tool is None:
            return ToolOutput(
                text=f"[unknown_tool] No tool named {name!r} is available. Use one of the tools you were offered.",
                is_error=True,
            )
        risk = self.call_risk(tool, arguments)
        by = "policy"
        if ctx is not None:
            decision = await ctx.approvals.approve(risk, tool=tool.name, arguments=arguments, call_id=call_id)
            approved, reason, by = decision.approved, decision.reason, decision.decided_by
        else:
            approved = self.approvals.check_risk(risk, grants) == "approved"
            reason = f"the policy for {risk} is {self.approvals.mode(risk)}"
        tracing.set_attributes(
            tracing.current(),
            unit_mcp__risk=risk,
            unit_mcp__tool__source=tool.source,
            unit_mcp__approval__decision="approved" if approved else "denied",
            unit_mcp__approval__by=by,
        )
        if not approved:
            return ToolOutput(
                text=f"[approval_denied] {tool.name} (risk: {risk}) is not approved: {reason}. "
                "Do not call it again in this turn; tell the user what approval it needs.",
                is_error=True,
            )
        if tool.source == LOCAL:
            return await self._call_local(self._local[tool.name], arguments, ctx)
        return await self._call_mcp(self._sources[tool.source], tool, arguments)

    async def dry_run(self, name: str, arguments: dict[str, Any]) -> ToolOutput | None:
        """A dry run of an MCP tool that has one (it writes nothing, at its lower risk), for a person deciding on
        the real call; None for any other tool."""
        tool = self.get(name)
        if tool is None or tool.source == LOCAL or tool.dry_run_risk is None:
            return None
        return await self._call_mcp(self._sources[tool.source], tool, {**arguments, "dry_run": True})

    async def _call_local(self, tool: LocalTool, arguments: dict[str, Any], ctx: CallContext | None) -> ToolOutput:
        args = tool.validate(arguments)
        if isinstance(args, Refusal):
            return ToolOutput(text=f"[{args.code}] {args.message}", is_error=True)
        call_args: tuple[Any, ...] = () if tool.spread else (args,)
        kwargs: dict[str, Any] = {k: getattr(args, k) for k in type(args).model_fields} if tool.spread else {}
        if tool.needs_context:
            kwargs["ctx"] = ctx
        try:
            if inspect.iscoroutinefunction(tool.fn):
                value = await tool.fn(*call_args, **kwargs)
            else:
                value = await anyio.to_thread.run_sync(lambda: tool.fn(*call_args, **kwargs), abandon_on_cancel=True)
        except ToolError as exc:
            return ToolOutput(text=f"[tool_error] {exc}", is_error=True)
        except Exception as exc:
            raise ToolFailed(f"local tool {tool.name} failed: {describe(exc)}") from exc
        return _output(value)

    async def _call_mcp(self, source: McpToolSource, tool: ToolDef, arguments: dict[str, Any]) -> ToolOutput:
        try:
            result = await source.call(tool.upstream_name, arguments)
        except MCPError as exc:
            return ToolOutput(text=f"[mcp_error] {tool.name}: {exc}", is_error=True)
        except Exception as exc:
            raise ToolFailed(f"MCP tool {tool.name} on {source.name} failed: {describe(exc)}") from exc
        return _mcp_output(result)

    # -- internals --------------------------------------------------------------------------------

    def call_risk(self, tool: ToolDef, arguments: dict[str, Any] | None) -> str:
        """The risk of one call, decided from its arguments: a local tool's `risk_for`, a dry run's lower risk, or
        the tool's risk (unknown arguments count as the real thing)."""
        local = self._local.get(tool.name) if tool.source == LOCAL else None
        if local is None or local.risk_for is None or arguments is None:
            return normalise_risk(call_risk(tool.risk, tool.dry_run_risk, arguments))
        try:
            return normalise_risk(local.risk_for(arguments))
        except Exception:
            log.warning("the risk of a call to %s could not be worked out; treating it as destructive", tool.name)
            return "destructive"

    def _add_preset_tools(self) -> None:
        presets = self.presets
        assert presets is not None

        def risk_of(arguments: dict[str, Any]) -> str:
            name = arguments.get("name")
            if not isinstance(name, str) or name not in presets.names():
                return "normal"  # the call fails on the unknown name; asking first would help nobody
            return presets.describe(self.registered(), name).risk

        async def change(name: str, ctx: CallContext | None, active: bool, reason: str = "") -> ToolOutput:
            try:
                changed = presets.activate(name) if active else presets.deactivate(name)
            except PresetError as exc:
                raise ToolError(str(exc)) from None
            info = presets.describe(self.registered(), name)
            if ctx is not None:
                kind = "preset-activated" if active else "preset-deactivated"
                data = {"name": name, "risk": info.risk, "tools": info.tools, "changed": changed}
                if reason:
                    data["reason"] = reason
                await ctx.turn.append_item(EventItem(kind=kind, data=data))
            state = "active" if active else "inactive"
            tools = ", ".join(info.tools) or "none right now"
            return ToolOutput(
                text=f"preset {name} is {state}{'' if changed else ' (it already was)'}; its tools: {tools}",
                structured=info.model_dump(mode="json"),
            )

        async def activate(name: str, reason: str = "", ctx: CallContext | None = None) -> ToolOutput:
            return await change(name, ctx, True, reason)

        async def deactivate(name: str, ctx: CallContext | None = None) -> ToolOutput:
            return await change(name, ctx, False)

        self.add_local(
            LocalTool(
                ACTIVATE,
                args=_ActivateArgs,
                fn=activate,
                description="Activate a capability preset, offering its tools from the next step on. A preset above "
                "normal risk needs the user's approval.",
                spread=True,
                needs_context=True,
                risk_for=risk_of,
            )
        )
        self.add_local(
            LocalTool(
                DEACTIVATE,
                args=_PresetArgs,
                fn=deactivate,
                description="Deactivate a capability preset when its tools are no longer needed.",
                spread=True,
                needs_context=True,
            )
        )


def _definition(tool: types.Tool, source: str, prefix: str = "") -> ToolDef:
    """A listed tool (of an MCP source, or a local tool's) as the surface knows it: its risk from `_meta`."""
    meta = tool.meta or {}
    dry_run_risk = meta.get(DRY_RUN_RISK_META_KEY)
    return ToolDef(
        name=prefix + tool.name,
        upstream_name=tool.name,
        source=source,
        risk=normalise_risk(meta.get(RISK_META_KEY)),
        dry_run_risk=None if dry_run_risk is None else normalise_risk(dry_run_risk),
        description=tool.description or "",
        title=tool.title,
        input_schema=dict(tool.input_schema),
        output_schema=dict(tool.output_schema) if tool.output_schema else None,
        annotations=tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else None,
    )
