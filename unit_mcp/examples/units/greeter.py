"""A file unit: greets people by name."""

import logging

log = logging.getLogger("units.greeter")


def greet(name):
    """Return a friendly greeting."""
    log.info("greeting %s", name)
    return f"Hello, {name}!"


# Served under /greeter/ by unit_mcp.asgi: GET /greeter/Ada.
from starlette.responses import PlainTextResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402


async def hello(request):
    return PlainTextResponse(greet(request.path_params["name"]))


routes = [Route("/{name}", hello)]
