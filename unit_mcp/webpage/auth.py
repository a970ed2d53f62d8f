"""Who may use a page (the agent runner's, the unit server's): the page's own script, holding a session secret
that no other server ever sees.

Browsers send a 127.0.0.1 cookie to every port, so the page keeps no cookie: a one-use login link gives the
script a secret it sends in `X-Page-Session`, which is the CSRF check too (docs/ui/access.md).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from urllib.parse import parse_qsl

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}
SESSION_HEADER = "x-page-session"
SESSION_SECONDS = 15 * 60.0  # a page session's idle lifetime
KEPT = 64  # outstanding login tokens, live sessions, and spent tokens remembered (the oldest go first)
MAX_FORM_BYTES = 64 * 1024


def unauthorized(link: str) -> str:
    """What a request without a live session is told; `link` names the printed login URL (`AGENT_UI_URL`)."""
    return f"Unauthorized: open the {link} this page's server printed (it carries the token once)."


def spent(link: str, link_file: str | None = None) -> str:
    """What a spent login link is told; `link_file` names the printed path of the file holding the newest link."""
    written = f", and writes it to the file {link_file} names" if link_file else ""
    return (
        f"Gone: this login link was used already (each {link} works once). Open the newest {link} the "
        f"page's server printed: it prints a new one after each login{written}."
    )


# shell(scope, status, session secret or None, message shown when the script cannot do better) -> the page
Shell = Callable[[Scope, int, "str | None", str], Response]


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def _remember(table: OrderedDict[bytes, float], key: bytes, value: float) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > KEPT:
        table.popitem(last=False)


class PageAuth:
    def __init__(
        self,
        app: ASGIApp,
        *,
        shell: Shell,
        link: str,
        link_file: str | None = None,
        on_login: Callable[[], None] | None = None,
        session_seconds: float = SESSION_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.shell = shell
        self.unauthorized = unauthorized(link)
        self.spent_message = spent(link, link_file)
        self.on_login = on_login
        self.session_seconds = session_seconds
        self.clock = clock
        self.logins: OrderedDict[bytes, float] = OrderedDict()  # digests of unspent login tokens
        self.spent: OrderedDict[bytes, float] = OrderedDict()
        self.page_sessions: OrderedDict[bytes, float] = OrderedDict()  # secret digest -> expiry

    def new_login(self) -> str:
        """A login token that works once."""
        token = secrets.token_urlsafe(32)
        _remember(self.logins, _digest(token), self.clock())
        return token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        page_session = self._page_session(Headers(scope=scope))

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            elif page_session is not None:
                self._renew(page_session)
            await send(message)

        refusal = self.refusal(scope, page_session)
        if refusal is not None:
            await refusal(scope, receive, secured)
            return
        await self.app(scope, receive, secured)

    def refusal(self, scope: Scope, page_session: bytes | None) -> Response | None:
        method = scope["method"]
        if method not in ("GET", "HEAD", "POST"):
            return PlainTextResponse("Method not allowed.", status_code=405, headers={"Allow": "GET, HEAD, POST"})
        reading = method in ("GET", "HEAD")
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = [value for key, value in query if key == "token"]
        if given and method == "GET":  # not HEAD: a link preview must not spend it
            return self._login(scope, given[0])
        if reading and scope["path"][len(scope.get("root_path", "")) :].startswith("/static/"):
            return None
        if page_session is None:
            refused = self.unauthorized
            return self.shell(scope, 401, None, refused) if reading else PlainTextResponse(refused, 401)
        if method == "POST":
            headers = Headers(scope=scope)
            origin = headers.get("origin")
            if origin is not None and origin != f"http://{headers.get('host', '')}":
                return PlainTextResponse("Forbidden: a form of another site.", status_code=403)
            if headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
                return PlainTextResponse("Forbidden: a request from another site.", status_code=403)
            length = headers.get("content-length")
            if length is None or not length.isdigit() or int(length) > MAX_FORM_BYTES:
                return PlainTextResponse("A form of at most 64 KiB, with a Content-Length.", status_code=413)
        return None

    def _login(self, scope: Scope, token: str) -> Response:
        digest = _digest(token)
        if self.logins.pop(digest, None) is None:
            if digest in self.spent:
                return self.shell(scope, 410, None, self.spent_message)
            return self.shell(scope, 401, None, self.unauthorized)
        _remember(self.spent, digest, self.clock())
        secret = secrets.token_urlsafe(32)
        self._renew(_digest(secret))
        if self.on_login is not None:
            self.on_login()
        return self.shell(scope, 200, secret, "")

    def _page_session(self, headers: Headers) -> bytes | None:
        given = headers.get(SESSION_HEADER)
        if not given:
            return None
        digest = _digest(given)
        expiry = self.page_sessions.get(digest)
        if expiry is None or expiry <= self.clock():
            self.page_sessions.pop(digest, None)
            return None
        self._renew(digest)
        return digest

    def _renew(self, digest: bytes) -> None:
        _remember(self.page_sessions, digest, self.clock() + self.session_seconds)
