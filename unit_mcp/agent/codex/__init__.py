"""Codex as an agent provider: the real Codex CLI (`codex exec --json`) runs each turn, offline-safe.

`CodexModel` is the agent's own model (any Responses API endpoint, e.g. the scripted model);
`CodexHome` and `codex_config` give each run an isolated CODEX_HOME/HOME and `config.toml`;
`CodexProcess` runs one `codex exec` and yields its JSONL events; `CodexAgent` drives turns with it and
records what Codex did as session items; `register` adds one to an `AgentRegistry`.
"""

from .agent import CodexAgent, TurnView, register
from .config import PINNED_VERSION, CodexModel, McpServer, codex_config, dumps_toml, model_catalog
from .errors import CodexError, CodexNotInstalled
from .events import CodexEvent, CodexUsage, McpToolCall, parse_line
from .home import CodexHome
from .process import CodexProcess, find_codex
from .recorder import EventRecorder

__all__ = [
    "PINNED_VERSION",
    "CodexAgent",
    "CodexError",
    "CodexEvent",
    "CodexHome",
    "CodexModel",
    "CodexNotInstalled",
    "CodexProcess",
    "CodexUsage",
    "EventRecorder",
    "McpServer",
    "McpToolCall",
    "TurnView",
    "codex_config",
    "dumps_toml",
    "find_codex",
    "model_catalog",
    "parse_line",
    "register",
]
