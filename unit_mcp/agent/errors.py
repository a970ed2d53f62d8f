"""One error hierarchy for the agent layer, so a caller can branch on the kind of failure."""

from __future__ import annotations

from ..database import Unavailable


class AgentError(Exception):
    """Base of every error the agent layer raises on purpose."""


class SessionNotFound(AgentError):
    """No session with that id exists in the store."""


class SessionCorrupt(AgentError):
    """An old session journal (`sessions import`) is damaged somewhere other than its last line (a crash only ever
    tears the tail)."""


class SessionLocked(AgentError):
    """Another store (in this or another process) has the session open for writing; one writer at a time."""


class SessionStoreUnavailable(AgentError, Unavailable):
    """The session database cannot be reached right now; nothing was written. The store reconnects by itself."""


class UnknownApproval(AgentError):
    """No approval request of that id waits in the session (never asked, already answered, or withdrawn)."""


class AnsweredElsewhere(AgentError):
    """The request cannot be answered here: its turn is running and asks its own approver (or another turn runs)."""


class WorkerRunning(AgentError):
    """A durable worker that is alive and beating holds this executor id: a second one would take over its turns."""


class TurnClosed(AgentError):
    """The turn already ended (completed, failed or cancelled); late output from its agent is refused."""


class UnknownAgent(AgentError):
    """No agent is registered under that id, or its factory failed."""


class ToolError(AgentError):
    """Raised by a local tool to return an error result the model can act on (the turn goes on)."""


class ToolFailed(AgentError):
    """A tool crashed or its server is unreachable: this ends the turn, never the runner."""


class HookError(AgentError):
    """A loop hook raised; the message names the hook point and the hook."""


class EnricherError(AgentError):
    """A prompt enricher raised; the message names the enricher."""


class StepLimitReached(AgentError):
    """The turn used its step budget without the model giving a final answer."""


class EndpointError(AgentError):
    """The approval-filtered endpoint cannot start as asked (non-loopback host, port, config)."""
