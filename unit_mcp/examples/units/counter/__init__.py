"""A click counter: counts clicks, keeps its count across reloads and offers a "counter" activity."""

import logging

from .panel import Panel

log = logging.getLogger("units.counter")
count = 0
step = 1


def increment():
    """Add one step to the count and return the new count."""
    global count
    count += step
    log.info("count is now %d", count)
    return count


def init(host):
    host.register_activity("counter", lambda: Panel(lambda: count))
    log.info("counter ready at %d", count)


def drop():
    log.info("counter dropped at %d", count)


def snapshot():
    return {"count": count}


def restore(state):
    global count
    count = int(state.get("count", 0))




def __getattr__(name):
    """`routes` (served under /counter/ by unit_mcp.asgi) are made on first use, so a test run of this unit never
    imports the web stack."""
    if name == "routes":
        return _routes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _routes():
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def show(request):
        return JSONResponse({"count": count, "step": step})

    async def click(request):
        return JSONResponse({"count": increment()})

    return [Route("/", show), Route("/increment", click, methods=["POST"])]
