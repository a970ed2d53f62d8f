"""Errors of the OpenCode provider, inside the agent layer's one hierarchy (`AgentError`).

A caller branches on the kind: the node cannot be reached (retry later, or reconnect), the node does not
know a session (replace it), the node refused a request (a bug or a version mismatch: the message carries
the status and OpenCode's own words), or the binary cannot be found or started (install it).
"""

from __future__ import annotations

from ..errors import AgentError


class OpenCodeError(AgentError):
    """Base of every error the OpenCode client, node process and agent raise on purpose."""


class NodeUnavailable(OpenCodeError):
    """The node did not answer in time, refused the connection, or the client is closed."""


class OpenCodeHTTPError(OpenCodeError):
    """The node answered a request with an error status; `status` and `body` say what it objected to."""

    def __init__(self, message: str, *, status: int, body: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class UnknownOpenCodeSession(OpenCodeHTTPError):
    """The node does not know the session id (404): it was deleted, or the node lost its data."""


class OpenCodeNotInstalled(OpenCodeError):
    """No `opencode` binary where it was looked for; the message says where and how to install it."""


class NodeStartError(OpenCodeError):
    """`opencode serve` exited or did not become ready in time; the message carries its last output."""
