"""Who may use the page: the holder of the per-run token, from a page of this very server.

Behind the project's Host/Origin guard (`loopback.Guard`, as for the MCP endpoints) this middleware

- trades the token the printed URL carries (`?token=…`, once) for an HttpOnly, SameSite=Strict cookie and
  redirects to the same URL without it, so the token leaves the address bar and the history;
- refuses every other request without that cookie (401), and every method but GET/HEAD/POST (405);
- refuses a POST whose `Origin` is not exactly this server's or that a browser says came from another site:
  other loopback ports are the same *site* to a browser, so SameSite alone does not stop them. The form's
  CSRF token is checked by the endpoint (`check_csrf`);
- sets a strict Content-Security-Policy and no-store headers on every answer; the referrer goes to this
  server only (`no-referrer` would make the browser send `Origin: null` with the forms).

Cookies are not kept apart by port, so the cookie's name carries the port: two pages on one machine do not
overwrite each other's.
"""

from __future__ import annotations

import secrets
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import PlainTextResponse, RedirectResponse, Response
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
MAX_FORM_BYTES = 64 * 1024
UNAUTHORIZED = "Unauthorized: open the AGENT_UI_URL this page's server printed (it carries the token once)."


class PageAuth:
    def __init__(self, app: ASGIApp, *, token: str, csrf: str, port: int) -> None:
        self.app = app
        self.token = token.encode()
        self.csrf = csrf.encode()
        self.cookie = f"unit_mcp_ui_{port}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        refusal = self.refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, secured)
            return
        await self.app(scope, receive, secured)

    def refusal(self, scope: Scope) -> Response | None:
        method = scope["method"]
        if method not in ("GET", "HEAD", "POST"):
            return PlainTextResponse("Method not allowed.", status_code=405, headers={"Allow": "GET, HEAD, POST"})
        headers = Headers(scope=scope)
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = [value for key, value in query if key == "token"]
        if given and method in ("GET", "HEAD"):
            if not secrets.compare_digest(given[0].encode(), self.token):
                return PlainTextResponse(UNAUTHORIZED, status_code=401)
            return self._login(scope, [(key, value) for key, value in query if key != "token"])
        if not secrets.compare_digest(self._cookie(headers).encode(), self.token):
            return PlainTextResponse(UNAUTHORIZED, status_code=401)
        if method == "POST":
            origin = headers.get("origin")
            if origin is not None and origin != f"http://{headers.get('host', '')}":
                return PlainTextResponse("Forbidden: a form of another site.", status_code=403)
            if headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
                return PlainTextResponse("Forbidden: a request from another site.", status_code=403)
            length = headers.get("content-length")
            if length is None or not length.isdigit() or int(length) > MAX_FORM_BYTES:
                return PlainTextResponse("A form of at most 64 KiB, with a Content-Length.", status_code=413)
        return None

    def _cookie(self, headers: Headers) -> str:
        for part in headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == self.cookie:
                return value
        return ""

    def _login(self, scope: Scope, query: list[tuple[str, str]]) -> Response:
        root = scope.get("root_path", "")  # where the app is mounted; `path` already starts with it
        target = scope["path"] + (f"?{urlencode(query)}" if query else "")
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            self.cookie, self.token.decode(), path=root or "/", httponly=True, samesite="strict", secure=False
        )
        return response

    def check_csrf(self, form_token: object) -> bool:
        return isinstance(form_token, str) and secrets.compare_digest(form_token.encode(), self.csrf)
