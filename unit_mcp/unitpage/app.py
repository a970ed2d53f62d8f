"""UnitsUI: the unit server's page over a `UnitService`, a Starlette app the bridge mounts at /units.

Writes made here (roll back, revert, checkpoint) go through the service like a tool call's, recorded as made by
`PAGE_CALLER`; each is a dry run first, shown, then confirmed.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Unpack
from urllib.parse import urlencode

import anyio
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from ..changelog import PAGE, Change
from ..confirm import Confirmations
from ..errors import UnitError
from ..localaccess import LocalAccess
from ..paths import validate_unit_id
from ..service import UnitService, call_as
from ..webpage import (
    DiffCache,
    DiffLine,
    PageApp,
    PageOptions,
    diff_lines,
    unified_lines,
)

log = logging.getLogger("unit_mcp.unitpage")
HERE = Path(__file__).parent
PAGE_CALLER = PAGE
POLL_SECONDS = 0.5  # how often an open page's event stream looks at the change log and the units
SHOWN_CHANGES = 100
SHOWN_CHECKPOINTS = 20
MAX_FILTER = 200
LEFT_OUT = "Its diff is left out of this preview (the preview's size budget is spent); it is put back all the same."


@dataclass(frozen=True)
class UnitRow:
    unit_id: str
    loaded: bool
    load_error: str | None
    hash: str | None
    last_change: int | None


@dataclass(frozen=True)
class SourceDiff:
    unit_id: str
    source_id: str
    action: str
    lines: list[DiffLine] | None
    missing: str = "The change log kept no bytes of this source to compare (an outside change it never saw before)."
    """Shown instead of `lines` when they are None."""


class UnitsUI(PageApp):
    """The page's app (`app`) for `service`. With `port` it carries its own loopback guard (to serve alone);
    without, whoever serves it guards Host/Origin (the bridge does)."""

    def __init__(
        self,
        service: UnitService,
        *,
        port: int | None = None,
        confirmations: Confirmations | None = None,
        local_access: LocalAccess | None = None,
        **options: Unpack[PageOptions],
    ) -> None:
        self.service = service
        self.confirmations = confirmations
        self.local_access = local_access
        self.diffs: DiffCache[int, tuple[Change, Markup] | None] = DiffCache()  # by change id: a change never changes
        if confirmations is not None and not confirmations.on_page:
            raise ValueError(
                "UnitsUI answers the questions of Confirmations made for a page: make them with "
                "Confirmations(risks, on_page=True) (without a page they are declined when the client cannot ask)"
            )
        super().__init__(
            templates=HERE / "templates",
            routes=[
                Route("/", self.changes_page),
                Route("/fragments/changes", self.changes_fragment),
                Route("/events", self.events),
                Route("/changes/{change_id:int}", self.change_page),
                Route("/changes/{change_id:int}/revert", self.revert, methods=["POST"]),
                Route("/checkpoints", self.checkpoint, methods=["POST"]),
                Route("/checkpoints/{checkpoint_id:int}/rollback", self.rollback, methods=["POST"]),
                Route("/questions/{question_id:int}/{answer:str}", self.answer, methods=["POST"]),
                Route("/grants/{grant_id:int}/revoke", self.revoke_grant, methods=["POST"]),
                Route("/local-access/{grant_id:str}/revoke", self.revoke_local_access, methods=["POST"]),
            ],
            link="UNITS_UI_URL",
            port=port,
            **options,
        )

    # -- reading ----------------------------------------------------------------------------------

    def _filters(self, request: Request) -> dict[str, str]:
        found = {}
        for name in ("unit", "client"):
            value = request.query_params.get(name, "").strip()
            if value:
                found[name] = value[:MAX_FILTER]
        return found

    def _overview(self, filters: dict[str, str]) -> dict[str, Any]:
        log_ = self.service.change_log
        unit = filters.get("unit")
        problem = None
        if unit is not None:
            try:
                validate_unit_id(unit)
            except UnitError as exc:
                problem, unit = exc.message, None
        changes: list[Change] = (
            [] if problem else log_.changes(unit_id=unit, client=filters.get("client"), limit=SHOWN_CHANGES)
        )
        units = []
        for summary in self.service.list().units:
            try:
                digest = self.service.inspect(summary.unit_id).source_handle.hash
            except UnitError:
                digest = None
            newest = log_.changes(unit_id=summary.unit_id, limit=1)
            units.append(
                UnitRow(summary.unit_id, summary.loaded, summary.load_error, digest, newest[0].id if newest else None)
            )
        clients = sorted({c.caller.name for c in log_.changes(limit=SHOWN_CHANGES) if c.caller.name})
        confirmations = self.confirmations
        return {
            "confirming": sorted(confirmations.risks) if confirmations else [],
            "questions": confirmations.questions() if confirmations else [],
            "grants": confirmations.grants() if confirmations else [],
            "local_access": self.local_access is not None,
            "local_grants": self.local_access.grants() if self.local_access else [],
            "units": units,
            "changes": changes,
            "checkpoints": [c for c in log_.checkpoints(2 * SHOWN_CHECKPOINTS) if c.caller != PAGE_CALLER][
                :SHOWN_CHECKPOINTS
            ],
            "own_checkpoints": log_.checkpoints(SHOWN_CHECKPOINTS, caller=PAGE_CALLER),  # a burst hides none
            "filters": filters,
            "clients": clients,
            "problem": problem,
        }

    def state(self) -> str:
        """Changes whenever what the page shows may have: the newest change, checkpoint, and the units' states."""
        log_ = self.service.change_log
        checkpoints = log_.checkpoints(1)
        asked = self.confirmations.version if self.confirmations else 0
        local = self.local_access.version if self.local_access else 0
        newest = f"{log_.latest_id()}:{checkpoints[0].id if checkpoints else 0}:{asked}:{local}"
        digest = hashlib.sha256(newest.encode())
        host = self.service.host
        for unit_id in sorted(host.unit_kinds()):  # cheap: no source is read (it runs twice a second per page)
            digest.update(f"\n{unit_id}:{host.is_loaded(unit_id)}:{host.load_error(unit_id)}".encode())
        return digest.hexdigest()[:16]

    async def changes_page(self, request: Request) -> Response:
        filters = self._filters(request)
        overview = await anyio.to_thread.run_sync(self._overview, filters)
        state = await anyio.to_thread.run_sync(self.state)
        return self.page(request, "changes.html", state=state, query=urlencode(filters), **overview)

    async def changes_fragment(self, request: Request) -> Response:
        overview = await anyio.to_thread.run_sync(self._overview, self._filters(request))
        return self.page(request, "_overview.html", **overview)

    async def change_page(self, request: Request) -> Response:
        change_id = request.path_params["change_id"]
        shown = await self.diffs.get(change_id, lambda: self._shown_change(change_id))
        if shown is None:
            return PlainTextResponse(f"No change {change_id} in the change log (it may have been pruned).", 404)
        change, diffs = shown
        return self.page(request, "change.html", change=change, diffs=diffs)

    def _shown_change(self, change_id: int) -> tuple[Change, Markup] | None:
        """The change and its diffs as the page shows them, read and rendered once (blocking: a long diff takes a
        while); None when the log has no such change."""
        change = self.service.change_log.change(change_id)
        if change is None:
            return None
        return change, Markup(self.templates.get_template("_change_diffs.html").render(diffs=_source_diffs(change)))

    async def events(self, request: Request) -> Response:
        """`store` events (id: the page's state) whenever the state changed since the id the client last saw."""
        return self.state_events(request, self.state, POLL_SECONDS)

    # -- answering the calls that wait for a yes (`--confirm`) -------------------------------------

    async def answer(self, request: Request) -> Response:
        """approve, deny, or allow (approve, and grant the question's client its risk for the form's minutes)."""
        answer, question_id = request.path_params["answer"], request.path_params["question_id"]
        if self.confirmations is None or answer not in ("approve", "deny", "allow"):
            return PlainTextResponse("Nothing to answer: this server asks no questions (start it with --confirm).", 404)
        if answer == "allow":
            async with request.form(max_files=0, max_fields=4) as form:
                minutes = str(form.get("minutes") or "")
            try:
                answered = self.confirmations.allow(question_id, _minutes(minutes)) is not None
            except ValueError as exc:
                return PlainTextResponse(f"Not allowed: {exc}; go back and correct it.", 400)
        else:
            answered = self.confirmations.answer(question_id, answer == "approve", by="the page")
        if not answered:
            return PlainTextResponse("That call is no longer waiting (answered, timed out or withdrawn).", 409)
        return RedirectResponse(f"{self.root(request)}/", status_code=303)

    async def revoke_grant(self, request: Request) -> Response:
        if self.confirmations is None or not self.confirmations.revoke(request.path_params["grant_id"]):
            return PlainTextResponse("No such grant (it expired or was revoked).", 404)
        return RedirectResponse(f"{self.root(request)}/", status_code=303)

    # -- local access (--allow-local-access): the grants that last, revoked here ------------------

    async def revoke_local_access(self, request: Request) -> Response:
        access, grant_id = self.local_access, request.path_params["grant_id"]
        if access is None or not await anyio.to_thread.run_sync(access.revoke, grant_id, PAGE_CALLER):
            return PlainTextResponse("No such local access (it expired or was revoked).", 404)
        return RedirectResponse(f"{self.root(request)}/", status_code=303)

    # -- writing: a preview first, then the confirmed call ----------------------------------------

    async def checkpoint(self, request: Request) -> Response:
        async with request.form(max_files=0, max_fields=4) as form:
            label = str(form.get("label") or "").strip()[:200] or None
        await anyio.to_thread.run_sync(call_as, PAGE_CALLER, lambda: self.service.checkpoint(label))
        return RedirectResponse(f"{self.root(request)}/", status_code=303)

    async def rollback(self, request: Request) -> Response:
        checkpoint_id = request.path_params["checkpoint_id"]
        confirmed, force = await _confirmation(request)

        def run() -> Any:
            return call_as(
                PAGE_CALLER, lambda: self.service.rollback(checkpoint_id, dry_run=not confirmed, force=force)
            )

        return await self._previewed(
            request,
            run,
            confirmed,
            what=f"Roll back to checkpoint {checkpoint_id}",
            action=f"/checkpoints/{checkpoint_id}/rollback",
        )

    async def revert(self, request: Request) -> Response:
        change_id = request.path_params["change_id"]
        confirmed, _ = await _confirmation(request)

        def run() -> Any:
            return call_as(PAGE_CALLER, lambda: self.service.revert_change(change_id, dry_run=not confirmed))

        return await self._previewed(
            request, run, confirmed, what=f"Revert change {change_id}", action=f"/changes/{change_id}/revert"
        )

    async def _previewed(
        self, request: Request, run: Callable[[], Any], confirmed: bool, *, what: str, action: str
    ) -> Response:
        try:
            result = await anyio.to_thread.run_sync(run)
        except UnitError as exc:
            return PlainTextResponse(f"{what}: refused ({exc.code}): {exc.message} {exc.hint}".strip(), 409)
        if confirmed:
            target = f"/changes/{result.change_id}" if result.change_id else "/"
            return RedirectResponse(f"{self.root(request)}{target}", status_code=303)
        diffs = [
            SourceDiff(s.unit_id, s.source_id, s.action, None if s.diff is None else unified_lines(s.diff), LEFT_OUT)
            for s in result.sources
        ]
        conflicts = getattr(result, "conflicts", [])
        return self.page(request, "preview.html", what=what, action=action, diffs=diffs, conflicts=conflicts)


async def _confirmation(request: Request) -> tuple[bool, bool]:
    async with request.form(max_files=0, max_fields=4) as form:
        return form.get("confirm") == "yes", form.get("force") == "yes"


def _minutes(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"minutes {text[:20]!r} is not a number; give whole minutes, e.g. 15") from None


def _source_diffs(change: Change) -> list[SourceDiff]:
    """What the change's page shows of each source (blocking: diffs are computed here)."""
    return [
        SourceDiff(
            s.unit_id,
            s.source_id,
            s.action,
            None
            if (s.data_before is None and s.hash_before) or (s.data_after is None and s.hash_after)
            else diff_lines(_text(s.data_before), _text(s.data_after)),
        )
        for s in change.sources
    ]


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", "replace")


__all__ = ["PAGE_CALLER", "UnitsUI"]
