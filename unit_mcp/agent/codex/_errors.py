"""Errors of the Codex provider, inside the agent layer's one hierarchy (`AgentError`).

A caller branches on the kind: the binary cannot be found (install it) or cannot be run. A run that fails
is not an exception: the agent fails the turn with Codex's own words (`codex_turn_failed`, `codex_exit`,
`codex_incomplete`, `codex_timeout`).
"""

from __future__ import annotations

from ..errors import AgentError


class CodexError(AgentError):
    """Base of every error the Codex process and agent raise on purpose."""


class CodexNotInstalled(CodexError):
    """No `codex` binary where it was looked for; the message says where and how to install it."""
