"""Codex as an agent provider: the real Codex CLI (`codex exec --json`) runs each turn, offline-safe.

`CodexModel` is the agent's own model (any Responses API endpoint, e.g. the scripted model); `CodexAgent`
runs each turn as one `codex exec` in an isolated CODEX_HOME (`.home`, `.config`, `.process`) and records
what Codex did as session items (`.recorder`); `register` adds one to an `AgentRegistry`.
"""

from ._agent import CodexAgent, TurnView, register
from ._config import PINNED_VERSION, CodexModel
from ._errors import CodexError, CodexNotInstalled
from ._process import find_codex

__all__ = [
    "PINNED_VERSION",
    "CodexAgent",
    "CodexError",
    "CodexModel",
    "CodexNotInstalled",
    "TurnView",
    "find_codex",
    "register",
]
