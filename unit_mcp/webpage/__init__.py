"""The parts every page of the project shares (the agent runner's approval page, the unit server's page): the
browser credential and CSRF/Origin rules (`auth.py`), the security headers, the base templates, the page script
and style (`static/`), server-sent events, and rendering a diff. Below both wings: it imports neither.

A page subclasses `PageApp`, giving its templates folder (whose `base.html` extends `page.html`), its routes and
the name of its printed login URL; `app` is then the ASGI app to serve or mount.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, TypedDict, TypeVar, Unpack

import anyio
import jinja2
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Scope

from ..loopback import Guard, security_settings
from ..patching import unified_diff
from .auth import SESSION_HEADER, SESSION_SECONDS, PageAuth

HERE = Path(__file__).parent
HEARTBEAT_SECONDS = 15.0


def when(timestamp: float | None) -> str:
    if not timestamp:
        return ""
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


SEP = "\n"
"""Where an event's lines end: the pages' reader (`ui.js`) splits events at a blank line of bare newlines."""


def sse(event: str, data: Any, event_id: str | None = None) -> ServerSentEvent:
    """One server-sent event; the data is one line of JSON (JSON escapes every newline)."""
    return ServerSentEvent(data=json.dumps(data), event=event, id=event_id, sep=SEP)


RECONNECT = ServerSentEvent(retry=1000, sep=SEP)
"""A stream's first event: a page whose stream ended reconnects after a second."""


def event_stream(body: AsyncIterator[ServerSentEvent]) -> Response:
    """Server-sent events (sse-starlette), with a comment every `HEARTBEAT_SECONDS` while nothing happens."""
    return EventSourceResponse(
        body, ping=HEARTBEAT_SECONDS, sep=SEP, headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )


@dataclass(frozen=True)
class DiffLine:
    """One row of a rendered diff: `kind` is add, del, ctx or hunk; a line number is None where it has none."""

    kind: str
    old: int | None
    new: int | None
    text: str


DIFF_MAX_LINES = 2_000
"""A text longer than this is not diffed for a page: one row says it is too large to show. difflib's worst case
grows with the cube of the lines of the window even with autojunk (0.2 s for 2,000 lines of a few repeated values),
and a page is no place to read a longer diff."""


def too_large(lines: int) -> list[DiffLine]:
    """The one row shown instead of a diff of `lines` lines."""
    return [DiffLine("hunk", None, None, f"too large to show: {lines:,} lines (a page shows up to {DIFF_MAX_LINES:,})")]


def diff_lines(before: str, after: str, *, context: int = 3) -> list[DiffLine]:
    """The rows of a unified diff of two texts, with the line numbers on either side (templates escape the text).

    The diff is the patches' own (`patching.unified_diff`: only the window between the common head and tail, with
    difflib's autojunk), and it is not computed past `DIFF_MAX_LINES`: blocking, call it off the event loop."""
    longest = max(before.count("\n"), after.count("\n")) + 1
    if longest > DIFF_MAX_LINES:
        return too_large(longest)
    diff = unified_diff(before, after, "", context=context)
    return unified_lines(diff.split("\n", 2)[2] if diff else "")


def unified_lines(diff: str) -> list[DiffLine]:
    """The rows of a unified diff given as text (a patch, a dry run's diff), numbered from its hunk headers."""
    if diff.count("\n") > 2 * DIFF_MAX_LINES:
        return too_large(diff.count("\n"))
    rows: list[DiffLine] = []
    old = new = 0
    for line in diff.splitlines():
        if line.startswith("\\"):  # "\ No newline at end of file" belongs to the line above it
            continue
        if line.startswith("@@"):
            parts = line.split()
            try:
                old = int(parts[1][1:].split(",")[0])
                new = int(parts[2][1:].split(",")[0])
            except (IndexError, ValueError):
                old = new = 0
            rows.append(DiffLine("hunk", None, None, line))
        elif line.startswith(("---", "+++")):
            rows.append(DiffLine("hunk", None, None, line))
        elif line.startswith("+"):
            rows.append(DiffLine("add", None, new, line[1:]))
            new += 1
        elif line.startswith("-"):
            rows.append(DiffLine("del", old, None, line[1:]))
            old += 1
        else:
            rows.append(DiffLine("ctx", old, new, line[1:] if line.startswith(" ") else line))
            old, new = old + 1, new + 1
    return rows


Key = TypeVar("Key", bound=Hashable)
Shown = TypeVar("Shown")


class DiffCache(Generic[Key, Shown]):
    """What a page shows of a diff, computed once per key (a change, a request) in a worker thread and kept (but
    None): a page is viewed and refreshed again and again, and two views at once compute it once."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._kept: OrderedDict[Key, Shown] = OrderedDict()
        self._computing: dict[Key, anyio.Lock] = {}

    async def get(self, key: Key, compute: Callable[[], Shown]) -> Shown:
        lock = self._computing.setdefault(key, anyio.Lock())
        async with lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                shown = self._kept[key]
            else:
                shown = await anyio.to_thread.run_sync(compute)
                if shown is not None:  # None (nothing to show yet) is asked again next time
                    self._kept[key] = shown
                    while len(self._kept) > self.size:
                        self._kept.popitem(last=False)
        if not lock.statistics().tasks_waiting:
            self._computing.pop(key, None)
        return shown


class PageOptions(TypedDict, total=False):
    """How a page is served: the `host` it is reached on (127.0.0.1 unless given), `on_login` called after each
    login, the printed name of a file holding the newest login link (`link_file`, named to a spent link), how long
    an unused page session lives (`session_seconds`) and the `clock` that counts it."""

    host: str
    link_file: str | None
    on_login: Callable[[], None] | None
    session_seconds: float
    clock: Callable[[], float]


class PageApp:
    """A page's Starlette app behind the loopback guard (Host/Origin) and `PageAuth` (the page's credential).

    Subclasses pass `templates` (their folder), `routes` and `link` (the printed login URL's name, e.g.
    `UNITS_UI_URL`); `port` is the port the page is reached on, for its own Host/Origin guard (None: whoever
    serves `app` guards it, as the bridge does); `on_login` runs after each login.
    """

    def __init__(
        self,
        *,
        templates: Path,
        routes: Sequence[BaseRoute],
        link: str,
        port: int | None,
        **options: Unpack[PageOptions],
    ) -> None:
        self.on_login = options.get("on_login")
        self.closing = False  # set by close_streams: the open event streams end within a poll
        self.templates = jinja2.Environment(
            loader=jinja2.ChoiceLoader(
                [jinja2.FileSystemLoader(templates), jinja2.FileSystemLoader(HERE / "templates")]
            ),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.filters.update(when=when, duration=duration)
        self.starlette = Starlette(routes=[*routes, Mount("/static", StaticFiles(directory=HERE / "static"))])
        self.auth = PageAuth(
            self.starlette,
            shell=self.shell,
            link=link,
            link_file=options.get("link_file"),
            on_login=self._logged_in,
            session_seconds=options.get("session_seconds", SESSION_SECONDS),
            clock=options.get("clock", time.monotonic),
        )
        self.app: ASGIApp = self.auth
        if port is not None:
            self.app = Guard(self.auth, security=security_settings(options.get("host", "127.0.0.1"), port), token=None)

    def close_streams(self) -> None:
        """End the open event streams (within a poll), e.g. before the server stops; pages reconnect."""
        self.closing = True

    def state_events(self, request: Request, state: Callable[[], str], poll_seconds: float) -> Response:
        """`store` events (id: `state()`, read off the loop every `poll_seconds`) whenever it changed since the event
        id the client last saw (`Last-Event-ID`, or `from` on the first connection); a comment now and then."""
        seen = request.headers.get("last-event-id") or request.query_params.get("from")

        async def stream() -> AsyncIterator[ServerSentEvent]:
            nonlocal seen
            yield RECONNECT
            while not self.closing:
                now = await anyio.to_thread.run_sync(state)
                if now != seen:
                    seen = now
                    yield sse("store", {}, now)
                await anyio.sleep(poll_seconds)

        return event_stream(stream())

    def login_url(self, base_url: str) -> str:
        """A new URL to open once: `base_url` (where the app is served or mounted) with a new login token."""
        return f"{base_url.rstrip('/')}/?token={self.auth.new_login()}"

    def root(self, request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    def page(self, request: Request, template: str, *, status_code: int = 200, **context: Any) -> HTMLResponse:
        html = self.templates.get_template(template).render(root=self.root(request), now=time.time(), **context)
        return HTMLResponse(html, status_code=status_code)

    def shell(self, scope: Scope, status: int, page_secret: str | None, message: str) -> Response:
        """The page without its data: its script fetches the page with its page-session secret, or shows `message`."""
        root = str(scope.get("root_path", "")).rstrip("/")
        html = self.templates.get_template("shell.html").render(
            root=root, status=status, page_secret=page_secret, message=message
        )
        return HTMLResponse(html, status_code=status)

    def _logged_in(self) -> None:
        if self.on_login is not None:
            self.on_login()


__all__ = [
    "DIFF_MAX_LINES",
    "HEARTBEAT_SECONDS",
    "RECONNECT",
    "SESSION_HEADER",
    "SESSION_SECONDS",
    "DiffCache",
    "DiffLine",
    "PageApp",
    "PageOptions",
    "diff_lines",
    "duration",
    "event_stream",
    "sse",
    "unified_lines",
    "when",
]
