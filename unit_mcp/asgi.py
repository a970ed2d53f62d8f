"""The application's web face: each loaded unit's `routes` under `/<unit_id>/`, every request through a use.

A request is a use of its unit until its response starts (host.py, `UnitUse`): a reload waits for the requests in
flight and holds new ones for its short window, so no request fails and no write is lost because of a reload. A
streamed body runs on after that, on the version it started with, and a reload does not wait for it: its writes
after the start go through `unit_use(request)`, a new use of the unit's current version.
"""

from __future__ import annotations

import types

import anyio
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .host import Host, UnitNotLoaded, UnitUse

RETRY_AFTER_S = 1
SCOPE_KEY = "unit_mcp.unit"
"""The request scope's (host, unit id) of the unit serving it, for `unit_use`."""


class UnitsApp:
    """An ASGI app over a host's units: `/` lists the units that serve routes, `/<unit_id>/…` is served by the
    unit's current `routes` (a list of Starlette routes). 503 with `Retry-After` for a unit of the store that is
    not loaded (it failed to load, or is being loaded for the first time), 404 for any other path. A unit's
    exception while it answers is logged with its traceback under `units.<unit_id>` (method and path, never
    headers) and answered 500."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self._routers: dict[str, tuple[types.ModuleType, ASGIApp]] = {}
        host.unit_listeners.append(self._forget)  # the routes of a reloaded or unloaded unit are not kept

    def _forget(self, unit_id: str) -> None:
        self._routers.pop(unit_id, None)

    def _router(self, unit_id: str, module: types.ModuleType) -> ASGIApp | None:
        cached = self._routers.get(unit_id)
        if cached is not None and cached[0] is module:
            return cached[1]
        routes = getattr(module, "routes", None)
        if not isinstance(routes, (list, tuple)):
            return None
        router = ExceptionMiddleware(Router(routes=[Mount(f"/{unit_id}", routes=list(routes))]))
        self._routers[unit_id] = (module, router)
        return router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] not in ("http", "websocket"):
            return
        path: str = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        unit_id = path.lstrip("/").partition("/")[0]
        if not unit_id:
            await self._index()(scope, receive, send)
        elif not unit_id.isidentifier():
            await PlainTextResponse("Not Found", 404)(scope, receive, send)
        elif not self.host.is_loaded(unit_id):
            await (await self._absent(unit_id))(scope, receive, send)
        else:
            await self._serve(unit_id, scope, receive, send)

    def _index(self) -> Response:
        served = {}
        for unit_id in self.host.loaded_units():
            module = self.host.module(unit_id)
            if module is not None and isinstance(getattr(module, "routes", None), (list, tuple)):
                served[unit_id] = f"{unit_id}/"
        return JSONResponse({"units": served})

    async def _absent(self, unit_id: str) -> Response:
        known = self.host.load_error(unit_id) is not None
        if not known:
            known = await anyio.to_thread.run_sync(self.host.unit_kind, unit_id) is not None
        if not known:
            return PlainTextResponse("Not Found", 404)
        return PlainTextResponse(f"unit {unit_id} is not loaded", 503, headers={"Retry-After": str(RETRY_AFTER_S)})

    async def _serve(self, unit_id: str, scope: Scope, receive: Receive, send: Send) -> None:
        scope[SCOPE_KEY] = (self.host, unit_id)
        use = self.host.use(unit_id)
        try:
            module = await use.__aenter__()
        except UnitNotLoaded:  # unloaded while the request waited for a reload
            await (await self._absent(unit_id))(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            if not started and message["type"] in ("http.response.start", "websocket.accept"):
                started = True
                use.release()  # the response has begun: a stream's body is its own, a reload need not wait for it
            await send(message)

        try:
            router = self._router(unit_id, module)
            if router is None:
                await PlainTextResponse("Not Found", 404)(scope, receive, send)
                return
            await router(scope, receive, sending)
        except Exception:
            self.host.unit_logger(unit_id).exception(
                "%s %s failed", scope.get("method", scope["type"].upper()), scope["path"]
            )
            if not started and scope["type"] == "http":
                await PlainTextResponse("Internal Server Error", 500)(scope, receive, send)
        finally:
            await use.__aexit__(None, None, None)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def unit_use(request: Request | Scope) -> UnitUse:
    """A new use of the unit serving `request` (a Starlette request or its ASGI scope), at the unit's version of
    now: `async with unit_use(request) as unit: unit.record(...)`. A streamed body runs on the version it started
    with, and a reload does not wait for it; its writes after the start go through this, each waiting for a
    reload's window like any request, so they land in the version that serves then (handed over by its snapshot),
    never in a superseded module."""
    scope = request.scope if isinstance(request, Request) else request
    try:
        host, unit_id = scope[SCOPE_KEY]
    except KeyError:
        raise LookupError("unit_use() takes a request served by units_app(host)") from None
    use: UnitUse = host.use(unit_id)
    return use


def units_app(host: Host) -> UnitsApp:
    """The ASGI app serving the host's units' routes; mount it in your own Starlette or FastAPI app
    (`Mount("/units", app=units_app(host))`) or serve it alone (`unit-mcp serve --app-port PORT`)."""
    return UnitsApp(host)
