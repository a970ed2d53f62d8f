"""OpenCodeClient: REST and the shared event stream of one `opencode serve` node, local or remote.

Every request has a bounded timeout and fails as the provider's errors (`NodeUnavailable`,
`UnknownOpenCodeSession`, `OpenCodeHTTPError`). The `/event` stream opens when the client is entered, before
the first prompt; `send` replaces a session the node no longer knows and retries once.
"""

from __future__ import annotations

import logging
import secrets
import string
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from typing import Any, Literal

import anyio
import anyio.abc
import httpx
from anyio.streams.memory import MemoryObjectReceiveStream
from pydantic import BaseModel

from ...resource import StackedResource
from ._errors import NodeUnavailable, OpenCodeError, OpenCodeHTTPError, UnknownOpenCodeSession
from ._event_stream import EventStream, NodeEvent

log = logging.getLogger("unit_mcp.agent.opencode.client")

PermissionReply = Literal["once", "always", "reject"]


class ModelRef(BaseModel):
    """A model as OpenCode names it: `providerID` (a provider in its config) and `modelID`."""

    provider_id: str
    model_id: str

    @classmethod
    def parse(cls, value: str | ModelRef | Mapping[str, str]) -> ModelRef:
        """`"provider/model"`, a ModelRef, or `{"providerID": …, "modelID": …}`."""
        if isinstance(value, ModelRef):
            return value
        if isinstance(value, str):
            provider, sep, model = value.partition("/")
            if not sep or not provider or not model:
                raise ValueError(f"an OpenCode model is 'provider/model', not {value!r}")
            return cls(provider_id=provider, model_id=model)
        return cls(provider_id=value["providerID"], model_id=value["modelID"])

    def wire(self) -> dict[str, str]:
        return {"providerID": self.provider_id, "modelID": self.model_id}

    def __str__(self) -> str:
        return f"{self.provider_id}/{self.model_id}"


_ID_ALPHABET = string.digits + string.ascii_letters
_ID_MASK = (1 << 48) - 1


def message_id_after(previous: str | None, *, created_ms: int) -> str:
    """A user message id minted as OpenCode mints its own (`msg_`, 12 hex digits of `ms << 12 | counter` cut to 48
    bits, 14 random characters), on the node's clock: just after `previous` (the session's newest message), else at
    the session's creation. A prompt sent again with the same id is taken once: the node rewrites the same message
    and its loop answers it once (measured on the pinned binary), which makes a replayed prompt step harmless.
    Every message of the reply, stamped later by the node, sorts after it."""
    value = ((created_ms << 12) + 1) & _ID_MASK
    if previous is not None:
        with suppress(ValueError):
            value = max(value, int(previous.removeprefix("msg_")[:12], 16) + 1)
    random = "".join(secrets.choice(_ID_ALPHABET) for _ in range(14))
    return f"msg_{value & _ID_MASK:012x}{random}"


class Sent(BaseModel):
    """A prompt the node accepted: the session it went to, the event mark to wait from, the newest message id
    before it (every message of the reply sorts after it) and the id of the prompt's own message."""

    session_id: str
    since: int
    after_message_id: str | None = None
    message_id: str | None = None
    replaced: bool = False
    previous_session_id: str | None = None
    replace_reason: str | None = None


class OpenCodeClient(StackedResource):
    def __init__(
        self,
        base_url: str,
        *,
        password: str | None = None,
        username: str = "opencode",
        directory: str | None = None,
        timeout: float = 30.0,
        heartbeat_timeout: float = 15.0,
        reconnect_delay: float = 0.25,
        poll_interval: float = 1.0,
        connect_wait: float = 5.0,
    ) -> None:
        """`password` is the node's OPENCODE_SERVER_PASSWORD (basic auth); `directory` selects the project
        instance on a node that serves several; `connect_wait` bounds how long a prompt waits for the event
        stream to be subscribed before it goes out anyway (and the polling fallback takes over)."""
        self.base_url = base_url.rstrip("/")
        self.username = username
        self.password = password
        self.directory = directory
        self.timeout = timeout
        self.connect_wait = connect_wait
        self.heartbeat_timeout = heartbeat_timeout
        self.reconnect_delay = reconnect_delay
        self.poll_interval = poll_interval
        self._http: httpx.AsyncClient | None = None
        self._events: EventStream | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    async def _open(self, stack: AsyncExitStack) -> None:
        auth = httpx.BasicAuth(self.username, self.password) if self.password is not None else None
        params = {"directory": self.directory} if self.directory else None
        self._http = await stack.enter_async_context(
            httpx.AsyncClient(base_url=self.base_url, auth=auth, params=params, timeout=self.timeout)
        )
        self._events = EventStream(
            self._http,
            self.session_statuses,
            heartbeat_timeout=self.heartbeat_timeout,
            reconnect_delay=self.reconnect_delay,
            poll_interval=self.poll_interval,
        )
        tg = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(tg.cancel_scope.cancel)
        stack.callback(self._events.close)
        tg.start_soon(self._events.run)

    async def aclose(self) -> None:
        """End the event stream, reject pending waiters, close the connections."""
        await super().aclose()
        self._http = None

    @property
    def events(self) -> EventStream:
        if self._events is None:
            raise NodeUnavailable(f"the OpenCode client of {self.base_url} is not open: use `async with`")
        return self._events

    def __repr__(self) -> str:
        return f"<OpenCodeClient {self.base_url}>"

    # -- REST -------------------------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        return dict(await self._request("GET", "/global/health"))

    async def config(self) -> dict[str, Any]:
        """The node's fully merged runtime config (every layer resolved), permission rules included."""
        return dict(await self._request("GET", "/config"))

    async def providers(self) -> dict[str, Any]:
        """`{"providers": [...], "default": {provider: model}}`: the models the node can use."""
        return dict(await self._request("GET", "/config/providers"))

    async def list_sessions(self) -> list[dict[str, Any]]:
        return list(await self._request("GET", "/session"))

    async def create_session(
        self, *, title: str | None = None, permission: list[dict[str, str]] | None = None
    ) -> dict[str, Any]:
        """A new session; `permission` rules (`{"permission", "pattern", "action"}`) are added to the
        agent's for this session only (last match wins)."""
        body: dict[str, Any] = {}
        if title is not None:
            body["title"] = title
        if permission is not None:
            body["permission"] = permission
        return dict(await self._request("POST", "/session", json=body))

    async def get_session(self, session_id: str) -> dict[str, Any]:
        return dict(await self._request("GET", f"/session/{session_id}", session_id=session_id))

    async def delete_session(self, session_id: str) -> bool:
        return bool(await self._request("DELETE", f"/session/{session_id}", session_id=session_id))

    async def messages(self, session_id: str, *, limit: int | None = None) -> list[dict[str, Any]]:
        """`{info, parts}` per message, oldest first (with `limit`, the newest `limit` of them)."""
        params = {"limit": limit} if limit is not None else None
        return list(await self._request("GET", f"/session/{session_id}/message", params=params, session_id=session_id))

    async def prompt_async(
        self,
        session_id: str,
        text: str,
        *,
        model: ModelRef | str | None = None,
        agent: str | None = None,
        system: str | None = None,
        tools: Mapping[str, bool] | None = None,
        message_id: str | None = None,
    ) -> int:
        """Send a prompt without waiting for the reply; returns the event mark to wait from. The event
        stream is subscribed first (bounded wait), and the session is marked busy at once. With `message_id`
        (`message_id_after`) the same prompt sent twice is taken once (a replayed durable step)."""
        events = self.events
        if not events.connected:
            await events.wait_connected(self.connect_wait)
        since = events.seq
        body: dict[str, Any] = {"parts": [{"type": "text", "text": text}]}
        if model is not None:
            body["model"] = ModelRef.parse(model).wire()
        if agent is not None:
            body["agent"] = agent
        if system is not None:
            body["system"] = system
        if tools is not None:
            body["tools"] = dict(tools)
        if message_id is not None:
            body["messageID"] = message_id
        await self._request(
            "POST", f"/session/{session_id}/prompt_async", json=body, session_id=session_id, expect=(200, 204)
        )
        events.mark_busy(session_id, since)
        return since

    async def abort(self, session_id: str) -> bool:
        return bool(await self._request("POST", f"/session/{session_id}/abort", session_id=session_id))

    async def session_statuses(self) -> dict[str, str]:
        """Status type per session the node considers active; a session not listed is idle."""
        raw = await self._request("GET", "/session/status")
        return {key: value.get("type", "idle") for key, value in dict(raw).items() if isinstance(value, dict)}

    async def mcp_status(self) -> dict[str, dict[str, Any]]:
        """Per configured MCP server: `{"status": "connected" | "failed" | …, …}`."""
        return dict(await self._request("GET", "/mcp"))

    async def permissions(self) -> list[dict[str, Any]]:
        """Pending permission requests of every session."""
        return list(await self._request("GET", "/permission"))

    async def reply_permission(self, request_id: str, reply: PermissionReply, message: str | None = None) -> bool:
        body: dict[str, Any] = {"reply": reply}
        if message is not None:
            body["message"] = message
        return bool(await self._request("POST", f"/permission/{request_id}/reply", json=body))

    # -- status and events ------------------------------------------------------------------------

    def status(self, session_id: str) -> str:
        return self.events.status(session_id)

    async def wait_idle(self, session_id: str, *, since: int, timeout: float, started: bool = False) -> str:
        """Wait until the session is idle after the event mark `since` (see `EventStream.wait_idle`)."""
        return await self.events.wait_idle(session_id, since=since, timeout=timeout, started=started)

    @asynccontextmanager
    async def listen(self, session_id: str | None = None) -> AsyncIterator[MemoryObjectReceiveStream[NodeEvent]]:
        async with self.events.listen(session_id) as events:
            yield events

    # -- session lifecycle ------------------------------------------------------------------------

    async def send(
        self,
        session_id: str | None,
        text: str,
        *,
        title: str | None = None,
        permission: list[dict[str, str]] | None = None,
        model: ModelRef | str | None = None,
        agent: str | None = None,
        system: str | None = None,
        on_session: Callable[[str], None] | None = None,
    ) -> Sent:
        """Prompt `session_id`, validated first (`open`), and if the node answers 404 on the prompt itself (the
        session vanished in between), replace it once. `on_session` learns the session id before the prompt goes
        out (so a cancel hook can abort it)."""
        opened = await self.open(session_id, title=title, permission=permission)
        for attempt in (1, 2):
            if on_session is not None:
                on_session(opened.session_id)
            try:
                since = await self.prompt_async(opened.session_id, text, model=model, agent=agent, system=system)
            except UnknownOpenCodeSession:
                if attempt == 2:
                    raise
                lost = opened.session_id
                opened = await self.open(None, title=title, permission=permission)
                if session_id is not None:
                    reason = f"the node lost session {lost} before the prompt reached it"
                    opened = opened.model_copy(
                        update={"replaced": True, "previous_session_id": session_id, "replace_reason": reason}
                    )
                continue
            return opened.model_copy(update={"since": since})
        raise OpenCodeError("unreachable")  # pragma: no cover

    async def open(
        self, session_id: str | None, *, title: str | None = None, permission: list[dict[str, str]] | None = None
    ) -> Sent:
        """The session a prompt goes to: `session_id` if the node knows it, else a new one (created with `title` and
        `permission`), with its newest message id and the id of the prompt to come; nothing is sent yet (`since` 0)."""
        if session_id is not None:
            try:
                newest = await self.messages(session_id, limit=1)
                after = str(newest[-1]["info"]["id"]) if newest else None
                created_ms = 0 if after else _created_ms(await self.get_session(session_id))
                return Sent(
                    session_id=session_id,
                    since=0,
                    after_message_id=after,
                    message_id=message_id_after(after, created_ms=created_ms),
                )
            except UnknownOpenCodeSession:
                pass
        info = await self.create_session(title=title, permission=permission)
        created = str(info["id"])
        replaced = session_id is not None
        return Sent(
            session_id=created,
            message_id=message_id_after(None, created_ms=_created_ms(info)),
            since=0,
            replaced=replaced,
            previous_session_id=session_id,
            replace_reason=f"the node no longer knows session {session_id}" if replaced else None,
        )

    # -- internals --------------------------------------------------------------------------------

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        expect: tuple[int, ...] = (200,),
    ) -> Any:
        http = self._http
        if http is None:
            raise NodeUnavailable(f"the OpenCode client of {self.base_url} is not open: use `async with`")
        try:
            with anyio.fail_after(self.timeout + 1):
                response = await http.request(method, path, json=json, params=params)
        except (httpx.TransportError, TimeoutError) as exc:
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise NodeUnavailable(f"OpenCode node {self.base_url} did not answer {method} {path}: {detail}") from exc
        if response.status_code not in expect:
            body = response.text[:1000]
            message = f"OpenCode node {self.base_url} answered {method} {path} with {response.status_code}: {body}"
            if response.status_code == 404 and session_id is not None:
                raise UnknownOpenCodeSession(message, status=404, body=body)
            raise OpenCodeHTTPError(message, status=response.status_code, body=body)
        if response.status_code == 204 or not response.content:
            return None
        try:
            return response.json()
        except ValueError as exc:
            raise OpenCodeHTTPError(
                f"OpenCode node {self.base_url} answered {method} {path} with non-JSON: {response.text[:200]}",
                status=response.status_code,
                body=response.text[:1000],
            ) from exc


def _created_ms(session: Any) -> int:
    """A node session's creation time in ms (its `time.created`), 0 where it has none."""
    time = session.get("time") if isinstance(session, dict) else None
    created = time.get("created") if isinstance(time, dict) else None
    return created if isinstance(created, int) else 0
