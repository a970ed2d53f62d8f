"""The approval and audit page: what waits for an answer across a session store, the sessions and their
transcripts, live, in a browser on loopback. See `app.py` (`AgentUI`, to mount in an application) and
`server.py` (`serve`, behind `python -m unit_mcp.agent ui`)."""

from .app import AgentUI
from .server import serve

__all__ = ["AgentUI", "serve"]
