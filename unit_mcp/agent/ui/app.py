"""AgentUI: the approval and audit page of one session store, a Starlette app served on loopback.

It shows the approvals waiting across sessions (answered through `AgentRunner.answer_approval`), the sessions
(archive or delete) and each transcript, live over server-sent events. The browser holds no cookie: see
`webpage/auth.py` and docs/ui/access.md.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

import anyio
from sse_starlette import ServerSentEvent
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from ...webpage import RECONNECT, PageApp, PageOptions, event_stream, sse
from ..errors import AgentError, SessionLocked, UnknownApproval
from ..items import SESSION_ID, SessionMeta
from ..sessions import Retirement, SessionStore
from ..status import AgentStatus, read_status, seconds
from .pending import PendingEntry, PendingIndex
from .transcript import TURN_ID, Change, Transcript

if TYPE_CHECKING:
    from .._runner import AgentRunner
    from ..turns import TurnHandle

log = logging.getLogger("unit_mcp.agent.ui")
HERE = Path(__file__).parent
REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
DECISIONS = {"approve": (True, False), "always": (True, True), "deny": (False, False)}
POLL_SECONDS = 0.25  # how often an open page's event stream asks the store what changed
STATUS_POLL_SECONDS = 1.0  # how often "Working now" looks again (its durations count in seconds)
NOTICES_KEPT = 64
PAGE_SIZE = 50  # sessions a page of the sessions list shows


def _cursor(token: str | None) -> int | None:
    """A page's event id: the store's change counter it has shown."""
    return int(token) if token is not None and token.isdigit() and len(token) < 19 else None


class AgentUI(PageApp):
    """The page's Starlette app (`app`, wrapped in the loopback guard and the page's credential) for `runner`'s store.

    `port` is the port the page is reached on (Host and Origin are checked against it); `system_db` the durable
    workers' system database ("Working now" lists them; None: none); `on_login` is called after each login (`serve`
    prints the next link); `session_seconds` is how long an unused page session lives.
    """

    def __init__(
        self,
        runner: AgentRunner,
        *,
        port: int,
        system_db: str | None = None,
        **options: Unpack[PageOptions],
    ) -> None:
        self.runner = runner
        self.browse = SessionStore(runner.store.address, read_only=True)
        self.pending = PendingIndex(self.browse, self._live_turn, runner.tools.dry_run)
        self.notices: OrderedDict[str, tuple[str, str]] = OrderedDict()
        super().__init__(
            templates=HERE / "templates",
            routes=[
                Route("/", self.pending_page, name="pending"),
                Route("/fragments/pending", self.pending_fragment),
                Route("/approvals/{session_id}/{request_id}", self.answer, methods=["POST"]),
                Route("/sessions", self.sessions_page),
                Route("/fragments/sessions", self.sessions_fragment),
                Route("/sessions/{session_id}", self.session_page),
                Route("/sessions/{session_id}/retire", self.retire, methods=["POST"]),
                Route("/sessions/{session_id}/undo/{turn_id}", self.undo_page),
                Route("/sessions/{session_id}/undo/{turn_id}", self.undo, methods=["POST"]),
                Route("/sessions/{session_id}/events", self.session_events),
                Route("/events", self.store_events),
                Route("/status", self.status_page),
                Route("/fragments/status", self.status_fragment),
                Route("/status/events", self.status_events),
            ],
            link="AGENT_UI_URL",
            port=port,
            **options,
        )
        self.templates.tests["session_id"] = lambda value: isinstance(value, str) and bool(SESSION_ID.fullmatch(value))
        self.templates.filters["seconds"] = seconds
        self.system_db = system_db

    # -- pages ------------------------------------------------------------------------------------

    async def pending_page(self, request: Request) -> Response:
        notice = self.notices.pop(request.query_params.get("notice", ""), None)
        entries = await self.pending.with_dry_runs(await anyio.to_thread.run_sync(self.pending.pending))
        return self.page(
            request,
            "pending.html",
            entries=entries,
            notice=notice,
            state=await anyio.to_thread.run_sync(self.store_state),
        )

    async def pending_fragment(self, request: Request) -> Response:
        entries = await self.pending.with_dry_runs(await anyio.to_thread.run_sync(self.pending.pending))
        return self.page(request, "_pending_list.html", entries=entries)

    async def sessions_page(self, request: Request) -> Response:
        return await self._sessions(request, "sessions.html")

    async def sessions_fragment(self, request: Request) -> Response:
        return await self._sessions(request, "_sessions_table.html")

    async def _sessions(self, request: Request, template: str) -> Response:
        """A page of sessions, newest first, from the `after` cursor of the page before."""
        after = request.query_params.get("after") or None
        try:
            listed = await anyio.to_thread.run_sync(self.browse.page, PAGE_SIZE, after)
        except AgentError as exc:
            return PlainTextResponse(f"{exc}.", status_code=400)
        state = await anyio.to_thread.run_sync(self.store_state)
        return self.page(request, template, metas=listed.sessions, after=after, older=listed.next, state=state)

    async def session_page(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        if not SESSION_ID.fullmatch(session_id):
            return PlainTextResponse("No such session.", status_code=404)

        def read() -> tuple[Transcript, int, list[SessionMeta]] | None:
            changes = self.browse.changes(session_id)
            if changes is None:
                return None
            transcript = Transcript(session_id)
            transcript.apply_all(changes.records)
            children = self.browse.list(parent_id=session_id)
            return transcript, changes.cursor, children

        found = await anyio.to_thread.run_sync(read)
        if found is None or not found[0].meta:
            return PlainTextResponse(f"No session {session_id} in this store.", status_code=404)
        transcript, position, children = found
        return self.page(
            request,
            "session.html",
            transcript=transcript,
            meta=transcript.meta,
            position=position,
            children=children,
        )

    async def status_page(self, request: Request) -> Response:
        status = await anyio.to_thread.run_sync(self.status)
        return self.page(request, "status.html", status=status, state=self.status_state(status))

    async def status_fragment(self, request: Request) -> Response:
        return self.page(request, "_status_table.html", status=await anyio.to_thread.run_sync(self.status))

    def status(self) -> AgentStatus:
        """Who is doing what: the store's running turns and the workers' beats (`unit-mcp agent status` alike)."""
        workers = []
        if self.system_db is not None:
            from .._durable import worker_beats

            workers = worker_beats(self.system_db)
        return read_status(self.browse, workers)

    # -- answers ----------------------------------------------------------------------------------

    async def answer(self, request: Request) -> Response:
        session_id, request_id = request.path_params["session_id"], request.path_params["request_id"]
        async with request.form(max_files=0, max_fields=8) as form:
            decision = form.get("decision")
        if not (SESSION_ID.fullmatch(session_id) and REQUEST_ID.fullmatch(request_id)):
            return PlainTextResponse("No such approval request.", status_code=404)
        if not isinstance(decision, str) or decision not in DECISIONS:
            return PlainTextResponse("decision must be approve, deny or always.", status_code=400)
        approved, remember = DECISIONS[decision]
        verdict = "Denied" if not approved else "Approved (always, this session)" if remember else "Approved"
        handle: TurnHandle | None = None
        try:
            answered = await self.runner.answer_approval(
                session_id, request_id, approved=approved, remember=remember, reason="answered on the approval page"
            )
        except SessionLocked:
            notice = (
                "error",
                f"Not answered: session {session_id} is open in another process, where its turn asks its own "
                "approver. Answer it there, or here once that process has ended.",
            )
        except UnknownApproval as exc:
            notice = ("error", f"Already answered or withdrawn: {exc}")
        except AgentError as exc:
            notice = ("error", f"Not answered: {exc}")
        else:
            handle = answered.handle
            what = f"{answered.request.tool or 'the call'} ({request_id})"
            outcome = {
                "sent_to_worker": f"durable turn {answered.turn_id} goes on on its worker.",
                "recorded": "the turn resumes once its other requests are answered.",
                "continued": f"turn {answered.turn_id} goes on.",
                "resumed": f"the turn resumed as {handle.id if handle else answered.turn_id}.",
            }[answered.how]
            notice = ("ok", f"{verdict}: {what} in session {session_id}; {outcome}")
        if handle is not None and handle.running:
            handle.on_complete(lambda ended: self._release(session_id))
            handle.on_error(lambda ended: self._release(session_id))
        else:
            self._release(session_id)
        return self._notify(request, notice)

    async def retire(self, request: Request) -> Response:
        """Archive or delete a session (the store refuses one a turn runs in and records it in its audit)."""
        session_id = request.path_params["session_id"]
        async with request.form(max_files=0, max_fields=8) as form:
            action = form.get("action")
        if not SESSION_ID.fullmatch(session_id):
            return PlainTextResponse("No such session.", status_code=404)
        if action not in ("archive", "delete"):
            return PlainTextResponse("action must be archive or delete.", status_code=400)
        chosen: Retirement = "archive" if action == "archive" else "delete"
        if self.runner.active_turn(session_id) is not None:
            return self._notify(request, ("error", f"Not {chosen}d: session {session_id} has a running turn."))
        try:
            meta = await anyio.to_thread.run_sync(lambda: self.runner.store.retire(session_id, chosen, via="page"))
        except AgentError as exc:
            return self._notify(request, ("error", f"Not {chosen}d: {exc}"))
        done = f"{chosen.capitalize()}d session {session_id} ({meta.title or 'untitled'})"
        return self._notify(request, ("ok", f"{done}; the store's audit log records it."))

    async def undo_page(self, request: Request) -> Response:
        """What undoing a turn would put back (the rollback's dry run: diffs and conflicts), and the button that
        asks for a person's yes."""
        session_id, turn_id = request.path_params["session_id"], request.path_params["turn_id"]
        if not (SESSION_ID.fullmatch(session_id) and TURN_ID.fullmatch(turn_id)):
            return PlainTextResponse("No such turn.", status_code=404)
        force = request.query_params.get("force") == "1"
        try:
            dry = await self.runner.undo_turn(session_id, turn_id, dry_run=True, force=force)
        except AgentError as exc:
            return self._notify(request, ("error", f"Turn {turn_id} cannot be undone: {exc}"))
        finally:
            self._release(session_id)
        return self.page(request, "undo.html", undo=dry, force=force)

    async def undo(self, request: Request) -> Response:
        """The person said yes: the units back to the checkpoint of the turn's start."""
        session_id, turn_id = request.path_params["session_id"], request.path_params["turn_id"]
        async with request.form(max_files=0, max_fields=8) as form:
            confirmed, force = form.get("confirm") == "yes", form.get("force") == "1"
        if not (SESSION_ID.fullmatch(session_id) and TURN_ID.fullmatch(turn_id)):
            return PlainTextResponse("No such turn.", status_code=404)
        if not confirmed:
            return PlainTextResponse("confirm must be yes.", status_code=400)
        try:
            done = await self.runner.undo_turn(session_id, turn_id, dry_run=False, force=force)
        except AgentError as exc:
            return self._notify(request, ("error", f"Turn {turn_id} not undone: {exc}"))
        finally:
            self._release(session_id)
        said = f"Turn {turn_id} of session {session_id} undone: {len(done.sources)} source(s) put back."
        if done.conflicts:
            left = ", ".join(f"{c['unit_id']}/{c['source_id']}" for c in done.conflicts)
            return self._notify(request, ("error", f"{said} Left alone (changed after the turn by others): {left}."))
        return self._notify(request, ("ok", said))

    # -- live updates -----------------------------------------------------------------------------

    def store_state(self) -> str:
        """A short digest of the store's version (every write, and writers that ended) and this process's live
        turns: it changes whenever anything a page shows may have changed."""
        live = ",".join(f"{sid}={turn}" for sid, turn in sorted(self.runner.live_turns().items()))
        digest = hashlib.sha256(f"{self.browse.version()}\n{live}".encode())
        return digest.hexdigest()[:16]

    async def store_events(self, request: Request) -> Response:
        """`store` events (id: the store's state) whenever the store changed since the event id the client last
        saw (`Last-Event-ID`, or `from` on the first connection)."""
        return self.state_events(request, self.store_state, POLL_SECONDS)

    def status_state(self, status: AgentStatus | None = None) -> str:
        """What "Working now" shows, to the second: its durations count while nothing else changes."""
        status = status or self.status()
        shown = status.model_copy(update={"at": int(status.at)}).model_dump_json(exclude={"workers"})
        beats = ",".join(f"{w.executor_id}:{w.alive}:{int(status.at - w.beat)}" for w in status.workers)
        return hashlib.sha256(f"{shown}\n{beats}".encode()).hexdigest()[:16]

    async def status_events(self, request: Request) -> Response:
        """`store` events whenever "Working now" would show something else (at most once a poll)."""
        return self.state_events(request, self.status_state, STATUS_POLL_SECONDS)

    async def session_events(self, request: Request) -> Response:
        """`item` and `status` events for what changed in one session since the store's change counter the client
        last saw (`Last-Event-ID`, or `from` on the first connection); `reset` when the session was deleted or
        replaced and the page must be reloaded."""
        session_id = request.path_params["session_id"]
        if not SESSION_ID.fullmatch(session_id):
            return PlainTextResponse("No such session.", status_code=404)
        start = _cursor(request.headers.get("last-event-id")) or _cursor(request.query_params.get("from"))
        render = self.templates.get_template("_item.html").module.item  # type: ignore[attr-defined]
        root = self.root(request)

        async def stream() -> AsyncIterator[ServerSentEvent]:
            yield RECONNECT
            transcript = Transcript(session_id)
            cursor = start or 0
            if start is not None:  # what the page showed: so results to come know when their call began
                shown = await anyio.to_thread.run_sync(self.browse.changes, session_id)
                if shown is None or shown.reset or shown.cursor < start:  # replaced since
                    yield sse("reset", {})
                    return
                transcript.apply_all([record for record in shown.records if record["seq"] <= start])
            while not self.closing:
                changes = await anyio.to_thread.run_sync(self.browse.changes, session_id, cursor)
                if changes is None or changes.reset:  # deleted or replaced: the reloaded page says so
                    yield sse("reset", {})
                    return
                shown_changes = transcript.apply_all(changes.records)
                for number, change in enumerate(shown_changes):
                    last = number == len(shown_changes) - 1
                    yield self._change_event(change, render, root, str(changes.cursor) if last else None)
                cursor = changes.cursor
                await anyio.sleep(POLL_SECONDS)

        return event_stream(stream())

    # -- internals --------------------------------------------------------------------------------

    def _change_event(
        self, change: Change, render: Callable[..., str], root: str, event_id: str | None
    ) -> ServerSentEvent:
        if change.item is not None:
            html = str(render(change.item, root))
            return sse("item", {"id": change.item.id, "html": html}, event_id)
        return sse("status", {"status": change.status}, event_id)

    def _notify(self, request: Request, notice: tuple[str, str]) -> Response:
        """Back to the approvals page, which shows `notice` once."""
        key = secrets.token_urlsafe(12)
        self.notices[key] = notice
        while len(self.notices) > NOTICES_KEPT:
            self.notices.popitem(last=False)
        return RedirectResponse(f"{self.root(request)}/?notice={key}", status_code=303)

    def _release(self, session_id: str) -> None:
        """Release the session answering opened here unless a turn of this process runs in it, so that a terminal
        or another process can open the session again (one writer per session)."""
        if self.runner.active_turn(session_id) is None:
            self.runner.store.invalidate(session_id)

    def _live_turn(self, session_id: str) -> str | None:
        handle = self.runner.active_turn(session_id)
        return None if handle is None else handle.id


__all__ = ["AgentUI", "PendingEntry"]
