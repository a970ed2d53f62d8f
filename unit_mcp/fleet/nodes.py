"""The fleet: named OpenCode nodes a master agent dispatches work to, over the existing node client.

Each node has one `OpenCodeClient` and one working session, made on first use. Sending is fire-and-forget
(the master polls status and reads messages); the status of a session this fleet did not dispatch is asked of
the node, and an id it does not know is refused, never guessed idle. Health never touches the working session.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import unquote, urlsplit, urlunsplit

import anyio
from pydantic import BaseModel, Field

from ..agent.opencode import NodeUnavailable, OpenCodeClient, OpenCodeError, UnknownOpenCodeSession, tool_part
from ..resource import StackedResource

DEFAULT_USERNAME = "opencode"
CHECK_SECONDS = 5.0  # at most this long at start for each node's permission mode (read side by side)
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


class FleetError(Exception):
    """A request the fleet refuses, in words the master agent can act on; `code` names the kind on the wire."""

    def __init__(self, message: str, *, code: str = "refused") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class NodeSpec:
    """One node: its name, its base URL (without credentials) and its basic-auth credentials, if any."""

    name: str
    url: str
    username: str = DEFAULT_USERNAME
    password: str | None = None

    @classmethod
    def parse(cls, text: str, *, username: str | None = None, password: str | None = None) -> NodeSpec:
        """`NAME=URL`; a user in the URL (`http://user@host:port`) wins over the shared one. A password in it is
        refused: a `--node` value is on the command line, which every local user reads."""
        name, sep, url = text.partition("=")
        name = name.strip()
        if not sep or not name or not url:
            raise FleetError(f"a node is NAME=URL (e.g. build=http://127.0.0.1:4096), not {text!r}")
        if not set(name) <= _NAME_CHARS:
            raise FleetError(f"node name {name!r} may use only letters, digits, '_', '-' and '.'")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise FleetError(f"node {name}: {url!r} is not an http(s) URL")
        if parts.password is not None:
            raise FleetError(
                f"node {name}: a password in the URL is readable by every local user (/proc/PID/cmdline); "
                f"drop it and set {password_variable(name)} (or FLEET_PASSWORD, or give --password-file FILE)"
            )
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        netloc = host + (f":{parts.port}" if parts.port else "")
        return cls(
            name=name,
            url=urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", "")),
            username=unquote(parts.username) if parts.username else username or DEFAULT_USERNAME,
            password=password,
        )


def password_variable(name: str) -> str:
    """The environment variable holding node `name`'s own password: FLEET_PASSWORD_<NAME>."""
    return "FLEET_PASSWORD_" + "".join(c if c.isalnum() else "_" for c in name.upper())


def node_specs(texts: Sequence[str], env: Mapping[str, str] | None = None, **shared: str | None) -> list[NodeSpec]:
    """Parse `--node` values; shared credentials default to FLEET_USERNAME / FLEET_PASSWORD, and a node's own
    FLEET_PASSWORD_<NAME> wins over the shared password."""
    env = os.environ if env is None else env
    username = shared.get("username") or env.get("FLEET_USERNAME")
    password = shared.get("password") or env.get("FLEET_PASSWORD")
    specs = []
    for text in texts:
        own = env.get(password_variable(text.partition("=")[0].strip()))
        specs.append(NodeSpec.parse(text, username=username, password=own or password))
    if not specs:
        raise FleetError("give at least one --node NAME=URL")
    names = [spec.name for spec in specs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise FleetError(f"node name(s) given twice: {', '.join(twice)}")
    return specs


# -- results ---------------------------------------------------------------------------------------


class NodeInfo(BaseModel):
    name: str
    url: str
    event_stream: Literal["connected", "reconnecting"]
    session_id: str | None = Field(None, description="The node's working session, once a message was sent.")
    permission: str = Field(
        description="The node's permission mode in one line, read when it connected (and by fleet_node_health): "
        "whether it never asks, or would block on a question nobody answers (then do not give it such work)."
    )


class NodeList(BaseModel):
    nodes: list[NodeInfo]


class Capabilities(BaseModel):
    summary: str = Field(description="What the node may do, in one paragraph a master agent can act on.")
    default: str | None = Field(None, description="The rule for every tool not listed ('*').")
    rules: dict[str, str] = Field(default_factory=dict, description="Per tool: allow, deny, ask, or mixed rules.")
    mcp: dict[str, str] = Field(default_factory=dict, description="Per MCP server: its connection status.")
    model: str | None = None


class Escalation(BaseModel):
    """What to do about a node that does not answer: for the master, and for the human it asks."""

    tried: list[str] = Field(description="What the fleet tried, and how long it waited.")
    check: list[str] = Field(description="What a human should check on the node, in order.")
    next_step: str = Field(description="What the master should do now.")


class Health(BaseModel):
    node: str
    healthy: bool
    version: str | None = None
    error: str | None = None
    capabilities: Capabilities | None = None
    escalation: Escalation | None = Field(default=None, description="Set when the node did not answer: follow it.")


class Dispatched(BaseModel):
    node: str
    session_id: str
    status: str = Field(description="busy: the node is working; poll fleet_get_session_status until idle.")
    new_session: bool
    replaced_session_id: str | None = Field(None, description="A session the node had lost, replaced by this one.")


class SessionStatus(BaseModel):
    node: str
    session_id: str
    status: str = Field(description="idle, busy or retry.")
    source: Literal["events", "node"] = Field(
        description="The event stream's cache (a session this fleet dispatched, stream up), or asked of the node."
    )


class ToolUse(BaseModel):
    tool: str
    status: str
    input: dict[str, Any] = Field(default_factory=dict)
    output: str | None = None
    error: str | None = None


class Message(BaseModel):
    id: str
    role: str
    text: str
    tools: list[ToolUse] = Field(default_factory=list)
    error: str | None = None
    completed: bool = True


class Messages(BaseModel):
    node: str
    session_id: str
    status: str
    messages: list[Message] = Field(description="The newest messages, oldest first.")


class Interrupted(BaseModel):
    node: str
    session_id: str
    interrupted: bool


class SessionSummary(BaseModel):
    id: str
    title: str | None = None
    status: str
    working: bool = Field(description="The fleet's working session on this node.")
    updated: float | None = None


class SessionList(BaseModel):
    node: str
    sessions: list[SessionSummary]


class Reset(BaseModel):
    node: str
    previous_session_id: str | None
    deleted: bool


class Model(BaseModel):
    id: str = Field(description="provider/model, as fleet_send_message takes it.")
    name: str | None = None
    default: bool = False


class ModelList(BaseModel):
    node: str
    default: str | None = None
    models: list[Model]


# -- the fleet --------------------------------------------------------------------------------------


@dataclass
class FleetNode:
    spec: NodeSpec
    client: OpenCodeClient
    session_id: str | None = None
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    dispatched: set[str] = field(default_factory=set)
    """Sessions this fleet sent a prompt to: the event stream's cache has followed them since."""
    permission: str = "not checked yet"
    blocks: bool = False
    """Whether the node would block on a question (`permission_mode`), as last read."""


def _clip(text: str | None, limit: int) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit} more characters]"


def capability_summary(config: Mapping[str, Any], mcp: Mapping[str, Any]) -> Capabilities:
    """The node's resolved permission rules as a master reads them: the default, each tool's rule (a tool with
    patterns is `mixed` and lists them, deny rules included), its MCP servers and its model."""
    permission = config.get("permission")
    default: str | None
    rules: dict[str, str] = {}
    if isinstance(permission, str):
        default = permission
    elif isinstance(permission, dict):
        default = permission.get("*") if isinstance(permission.get("*"), str) else None
        for tool, rule in permission.items():
            if tool == "*":
                continue
            if isinstance(rule, str):
                rules[tool] = rule
            elif isinstance(rule, dict):
                actions = set(rule.values())
                detail = ", ".join(f"{pattern}: {action}" for pattern, action in rule.items())
                rules[tool] = next(iter(actions)) if len(actions) == 1 else f"mixed ({detail})"
    else:
        default = None
    servers = {name: str(state.get("status", "unknown")) for name, state in mcp.items() if isinstance(state, dict)}
    if default is None and not rules:
        summary = "No permission rules are configured: OpenCode's defaults apply (edits and shell may ask)."
    else:
        actions = {default, *rules.values()} - {None}
        if actions == {"allow"}:
            summary = "Everything is allowed."
        elif actions == {"deny"}:
            summary = "Everything is denied: the node can only answer in text."
        elif actions == {"ask"}:
            summary = "Everything asks for approval."
        else:
            allowed = sorted(tool for tool, rule in rules.items() if rule == "allow")
            denied = sorted(tool for tool, rule in rules.items() if rule == "deny")
            mixed = sorted(tool for tool, rule in rules.items() if rule.startswith("mixed"))
            asked = sorted(tool for tool, rule in rules.items() if rule == "ask")
            parts = [f"Tools not listed: {default or 'OpenCode default'}."]
            parts += [f"Allowed: {', '.join(allowed)}."] if allowed else []
            parts += [f"Denied: {', '.join(denied)}."] if denied else []
            parts += [f"Asks: {', '.join(asked)}."] if asked else []
            parts += [f"Mixed rules: {'; '.join(f'{t} {rules[t]}' for t in mixed)}."] if mixed else []
            summary = " ".join(parts)
    if "ask" in {default, *rules.values()}:
        summary += " A rule that asks blocks a headless node (nobody answers): avoid work that needs it."
    if servers:
        summary += " MCP servers: " + ", ".join(f"{name} {status}" for name, status in sorted(servers.items())) + "."
    model = config.get("model") if isinstance(config.get("model"), str) else None
    return Capabilities(summary=summary, default=default, rules=rules, mcp=servers, model=model)


def permission_mode(capabilities: Capabilities) -> tuple[bool, str]:
    """Whether a node would block on a question (a rule that asks: nobody answers a headless node), and one line
    saying so; the fleet wants nodes that never ask (the design's auto mode: every rule allows or denies)."""
    asking = sorted(tool for tool, rule in capabilities.rules.items() if rule == "ask" or ": ask" in rule)
    if capabilities.default == "ask":
        asking.insert(0, "every tool not listed ('*')")
    if asking:
        return True, (
            f"would block on a question: {', '.join(asking)} ask, and nobody answers a headless node; make those "
            "rules allow or deny (start it as the fleet wants: never asking)"
        )
    if capabilities.default is None and not capabilities.rules:
        return True, (
            "would block on a question: no permission rules are configured, and OpenCode's defaults may ask; give "
            "it rules that allow or deny (start it as the fleet wants: never asking)"
        )
    return False, "never asks: every rule allows or denies"


def simplify(message: Mapping[str, Any], limit: int) -> Message:
    info = message.get("info") if isinstance(message.get("info"), dict) else {}
    assert isinstance(info, dict)
    parts = [part for part in message.get("parts") or [] if isinstance(part, dict)]
    tools = [tool_part(part) for part in parts if part.get("type") == "tool"]
    error = info.get("error")
    return Message(
        id=str(info.get("id", "")),
        role=str(info.get("role", "")),
        text=_clip("".join(str(p.get("text") or "") for p in parts if p.get("type") == "text"), limit) or "",
        tools=[
            ToolUse(tool=t.tool, status=t.status, input=t.input, output=_clip(t.output, limit), error=t.error)
            for t in tools
        ],
        error=None if error is None else str(error.get("name", error)) if isinstance(error, dict) else str(error),
        completed=info.get("role") != "assistant" or bool((info.get("time") or {}).get("completed")),
    )


class Fleet(StackedResource):
    """Enter it (`async with Fleet(specs) as fleet`) to open each node's client and event stream."""

    def __init__(self, specs: Sequence[NodeSpec], *, timeout: float = 30.0, text_limit: int = 4000) -> None:
        self.specs = list(specs)
        self.timeout = timeout
        self.text_limit = text_limit
        self._nodes: dict[str, FleetNode] = {}

    async def _open(self, stack: AsyncExitStack) -> None:
        for spec in self.specs:
            client = OpenCodeClient(spec.url, username=spec.username, password=spec.password, timeout=self.timeout)
            self._nodes[spec.name] = FleetNode(spec, await stack.enter_async_context(client))
        async with anyio.create_task_group() as tg:  # each node's permission mode, as it connects
            for node in self._nodes.values():
                tg.start_soon(self._check_permission, node)

    async def _check_permission(self, node: FleetNode) -> None:
        """Read the node's permission mode; a node that does not answer soon does not hold up the start."""
        seconds = min(self.timeout, CHECK_SECONDS)
        try:
            with anyio.fail_after(seconds):
                config = await node.client.config()
        except (OpenCodeError, TimeoutError) as exc:
            why = str(exc) or f"no answer within {seconds:g} s"
            node.permission = f"not checked: its config could not be read ({why}); fleet_node_health reads it again"
            return
        node.blocks, node.permission = permission_mode(capability_summary(config, {}))

    def blocking(self) -> list[str]:
        """One line per node that would block on a question (what `unit-mcp fleet` says at start)."""
        return [f"node {name} {node.permission}" for name, node in self._nodes.items() if node.blocks]

    def node(self, name: str) -> FleetNode:
        node = self._nodes.get(name)
        if node is None:
            raise FleetError(f"no node named {name!r}; the fleet has: {', '.join(self._nodes)} (see fleet_list_nodes)")
        return node

    @staticmethod
    def _unknown(node: FleetNode, session_id: str) -> FleetError:
        return FleetError(
            f"node {node.spec.name} does not know session {session_id}: take an id from fleet_list_sessions",
            code="unknown_session",
        )

    async def _status(self, node: FleetNode, session_id: str) -> tuple[str, Literal["events", "node"]]:
        """The cache only for a session the stream has followed; otherwise the node's own word: listed in
        `/session/status` is active, else the session must exist to be idle."""
        if session_id in node.dispatched and node.client.events.connected:
            return node.client.status(session_id), "events"
        active = await node.client.session_statuses()
        if session_id in active:
            return active[session_id], "node"
        try:
            await node.client.get_session(session_id)
        except UnknownOpenCodeSession:
            raise self._unknown(node, session_id) from None
        return "idle", "node"

    def _session(self, node: FleetNode, session_id: str | None) -> str:
        chosen = session_id or node.session_id
        if chosen is None:
            raise FleetError(
                f"node {node.spec.name} has no working session yet: send it a message with fleet_send_message, "
                "or pass a session_id from fleet_list_sessions"
            )
        return chosen

    # -- the operations ---------------------------------------------------------------------------

    def list_nodes(self) -> NodeList:
        return NodeList(
            nodes=[
                NodeInfo(
                    name=name,
                    url=node.spec.url,
                    event_stream="connected" if node.client.events.connected else "reconnecting",
                    session_id=node.session_id,
                    permission=node.permission,
                )
                for name, node in self._nodes.items()
            ]
        )

    async def health(self, name: str, *, include_capabilities: bool = True) -> Health:
        node = self.node(name)
        try:
            answer = await node.client.health()
        except NodeUnavailable as exc:
            return Health(node=name, healthy=False, error=str(exc), escalation=self._escalation(node, exc))
        except OpenCodeError as exc:
            return Health(node=name, healthy=False, error=str(exc))
        health = Health(node=name, healthy=bool(answer.get("healthy")), version=answer.get("version"))
        if include_capabilities:
            try:
                config, mcp = await node.client.config(), await node.client.mcp_status()
            except OpenCodeError as exc:
                health.error = f"the capabilities could not be read: {exc}"
                if isinstance(exc, NodeUnavailable):
                    health.escalation = self._escalation(node, exc)
            else:
                health.capabilities = capability_summary(config, mcp)
                node.blocks, node.permission = permission_mode(health.capabilities)
        return health

    def _escalation(self, node: FleetNode, exc: NodeUnavailable) -> Escalation:
        """The three steps the design asks for when a node does not answer: tried, check, next."""
        url, name = node.spec.url, node.spec.name
        return Escalation(
            tried=[f"{exc} (waited up to {self.timeout:g} s)"],
            check=[
                f"that `opencode serve` for node {name} is running and answers at {url} "
                f"(`curl {url}/global/health` on the master's machine)",
                "that nothing between the two (host, port, proxy, firewall) drops or holds the connection",
                "the node's own log and load: a hung or overloaded process needs a restart",
            ],
            next_step=(
                f"Do not dispatch to node {name}. Tell the user it does not answer and what to check (above), go on "
                "with the other nodes, and call fleet_node_health again later (the fleet reconnects by itself)."
            ),
        )

    async def send(self, name: str, message: str, *, model: str | None = None, new_session: bool = False) -> Dispatched:
        if not message.strip():
            raise FleetError("the message is empty: say what the node should do")
        node = self.node(name)
        async with node.lock:  # two dispatches to one node never create two working sessions
            previous = None if new_session else node.session_id
            try:
                sent = await node.client.send(previous, message, title=f"fleet: {message[:60]}", model=model)
            except ValueError as exc:  # a model that is not provider/model
                raise FleetError(str(exc)) from None
            node.session_id = sent.session_id
            node.dispatched.add(sent.session_id)
        return Dispatched(
            node=name,
            session_id=sent.session_id,
            status=node.client.status(sent.session_id),
            new_session=previous is None or sent.replaced,
            replaced_session_id=sent.previous_session_id if sent.replaced else None,
        )

    async def status(self, name: str, session_id: str | None = None) -> SessionStatus:
        """From the event stream's cache for a session this fleet dispatched while the stream is up (it refreshes
        the cache when it reconnects); otherwise from the node itself (see `_status`)."""
        node = self.node(name)
        chosen = self._session(node, session_id)
        status, source = await self._status(node, chosen)
        return SessionStatus(node=name, session_id=chosen, status=status, source=source)

    async def messages(self, name: str, session_id: str | None = None, *, limit: int = 10) -> Messages:
        """The newest `limit` messages (the tool's schema bounds it to 1-100)."""
        node = self.node(name)
        chosen = self._session(node, session_id)
        try:
            raw = await node.client.messages(chosen, limit=limit)
        except UnknownOpenCodeSession:
            raise self._unknown(node, chosen) from None
        status, _ = await self._status(node, chosen)
        return Messages(
            node=name,
            session_id=chosen,
            status=status,
            messages=[simplify(message, self.text_limit) for message in raw],
        )

    async def interrupt(self, name: str, session_id: str | None = None) -> Interrupted:
        node = self.node(name)
        chosen = self._session(node, session_id)
        try:
            done = await node.client.abort(chosen)
        except UnknownOpenCodeSession:
            raise self._unknown(node, chosen) from None
        return Interrupted(node=name, session_id=chosen, interrupted=done)

    async def list_sessions(self, name: str) -> SessionList:
        node = self.node(name)
        sessions = await node.client.list_sessions()
        active = await node.client.session_statuses()
        return SessionList(
            node=name,
            sessions=[
                SessionSummary(
                    id=str(session["id"]),
                    title=session.get("title"),
                    status=active.get(str(session["id"]), "idle"),
                    working=session["id"] == node.session_id,
                    updated=(session.get("time") or {}).get("updated"),
                )
                for session in sessions
                if isinstance(session, dict) and "id" in session
            ],
        )

    async def reset(self, name: str, *, delete: bool = False) -> Reset:
        node = self.node(name)
        async with node.lock:
            previous = node.session_id
            if previous is not None:
                try:
                    status, _ = await self._status(node, previous)
                except FleetError:  # the node lost it: nothing runs there
                    status = "idle"
                if status != "idle":
                    raise FleetError(
                        f"session {previous} on node {name} is {status}: wait until it is idle, or stop it with "
                        "fleet_interrupt_session first"
                    )
            deleted = False
            if previous is not None and delete:
                try:
                    deleted = await node.client.delete_session(previous)
                except UnknownOpenCodeSession:
                    deleted = False
            node.session_id = None
        return Reset(node=name, previous_session_id=previous, deleted=deleted)

    async def models(self, name: str) -> ModelList:
        node = self.node(name)
        answer = await node.client.providers()
        defaults = answer.get("default") if isinstance(answer.get("default"), dict) else {}
        config = await node.client.config()
        chosen = config.get("model") if isinstance(config.get("model"), str) else None
        models: list[Model] = []
        for provider in answer.get("providers") or []:
            if not isinstance(provider, dict):
                continue
            for model_id, model in (provider.get("models") or {}).items():
                ref = f"{provider.get('id')}/{model_id}"
                name_ = model.get("name") if isinstance(model, dict) else None
                models.append(Model(id=ref, name=name_, default=ref == chosen))
        if chosen is None and defaults:
            provider, model_id = next(iter(defaults.items()))
            chosen = f"{provider}/{model_id}"
        return ModelList(node=name, default=chosen, models=models)
