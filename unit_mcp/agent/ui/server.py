"""Serving the page on its own loopback port, as `python -m unit_mcp.agent ui` does."""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING, TextIO

import anyio

from ...loopback import LoopbackServer
from ..errors import AgentError
from .app import POLL_SECONDS, AgentUI

if TYPE_CHECKING:
    from .._runner import AgentRunner


async def serve(
    runner: AgentRunner,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    out: TextIO = sys.stdout,
    system_db: str | None = None,
) -> None:
    """Serve the page for `runner` until SIGINT or SIGTERM; print `AGENT_UI_URL=<url>` once it listens, and a new
    one after each login (each works once). `system_db`: the durable workers' system database, if any."""
    server = LoopbackServer(host=host, port=port, error=AgentError)
    ui = AgentUI(runner, host=server.host, port=server.bind(), system_db=system_db)

    def announce() -> None:  # each link works once: a new one after each login
        print(f"AGENT_UI_URL={ui.login_url(server.base_url)}", file=out, flush=True)

    ui.on_login = announce
    await server.start(ui.app)
    try:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            announce()  # only now: a SIGTERM sent as soon as the line is read ends the page cleanly
            async for _ in signals:
                break
    finally:
        ui.close_streams()
        await anyio.sleep(POLL_SECONDS)  # let the open event streams see it and end
        await server.stop()
