"""The parts of a Codex run that tests check without a CodexAgent: what a run is given (its config and TOML, its
isolated home, the prompt carrying earlier turns), one `codex exec` started as the agent starts it, and the events
read from its stdout. They are the provider's internals (`unit_mcp.agent.codex` exports the agent, its model and
`register`): tests reach them here only."""

from __future__ import annotations

from pathlib import Path

from unit_mcp.agent.codex import CodexModel
from unit_mcp.agent.codex._agent import EXEC_ARGS
from unit_mcp.agent.codex._config import MCP_TOKEN_ENV, MODEL_KEY_ENV, McpServer, codex_config, dumps_toml
from unit_mcp.agent.codex._history import CLIPPED, codex_prompt
from unit_mcp.agent.codex._home import CodexHome
from unit_mcp.agent.codex._output import McpToolCall, parse_line
from unit_mcp.agent.codex._process import CodexProcess

__all__ = [
    "CLIPPED",
    "MCP_TOKEN_ENV",
    "MODEL_KEY_ENV",
    "CodexHome",
    "McpServer",
    "McpToolCall",
    "codex_config",
    "codex_exec",
    "codex_prompt",
    "dumps_toml",
    "parse_line",
]


def codex_exec(binary: Path, home: CodexHome, model: CodexModel, server: McpServer, prompt: str) -> CodexProcess:
    """One `codex exec` as CodexAgent starts it (JSON events, `--strict-config`, the prompt on stdin), in `home`
    written for `model` and `server`; not started yet (`async with`)."""
    home.write(model, server)
    return CodexProcess(
        binary, [*EXEC_ARGS, "--strict-config", "-"], prompt=prompt, env=home.env(model, server), cwd=home.workdir
    )
