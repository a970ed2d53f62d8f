"""The wire contract of unit-mcp's MCP servers, shared by the server wing and its clients (the agent wing):
what a tool's and a refusal's `_meta` carry, and where the HTTP transports are served. A leaf: imports nothing."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, get_args

Risk = Literal["normal", "filesystem-read", "filesystem-write", "shell", "destructive"]
"""A tool's risk label, lowest first; approval policies are keyed on it."""
RISKS: tuple[Risk, ...] = get_args(Risk)

RISK_META_KEY = "unit_mcp/risk"
"""The key of a listed tool's `_meta` that holds its risk label: what its calls may do at most."""
DRY_RUN_RISK_META_KEY = "unit_mcp/dry_run_risk"
"""The key of a listed tool's `_meta` that holds the risk of a call with `"dry_run": true`, when that is lower
(a write that reloads runs code, `shell`; its dry run only reads). Apply it with `call_risk`."""
REPLAY_META_KEY = "unit_mcp/replay"
"""The key of a call's `_meta` that is true when the caller may be repeating a call whose result is in place (a
durable step run again after its worker died): such a write answers `already_applied` instead of `stale_hash`.
Only a caller that declares it gets that answer, so two clients making the same edit at once still conflict."""
ERROR_META_KEY = "unit_mcp/error"
"""The key of a refused call's `_meta` that holds the refusal: code, message, hint and details."""

MCP_PATH = "/mcp"
"""Streamable HTTP."""
SSE_PATH = "/sse"
"""The legacy SSE event stream; its client posts its messages to `MESSAGE_PATH`."""
MESSAGE_PATH = "/messages/"


def call_risk(risk: str, dry_run_risk: str | None, arguments: Mapping[str, object] | None) -> str:
    """The risk of one call of a tool: its `dry_run_risk` when the call's `dry_run` is exactly true, else `risk`
    (anything else, a "true" string included, is judged as the real thing)."""
    if dry_run_risk is not None and arguments is not None and arguments.get("dry_run") is True:
        return dry_run_risk
    return risk


def risk_meta(risk: str, dry_run_risk: str | None) -> dict[str, str]:
    """A listed tool's `_meta`: its risk, and its dry-run risk if it has one."""
    return {RISK_META_KEY: risk} if dry_run_risk is None else {RISK_META_KEY: risk, DRY_RUN_RISK_META_KEY: dry_run_risk}


def validation_problems(errors: Iterable[Mapping[str, Any]], whole: str = "arguments") -> str:
    """A validation error's findings (pydantic's `exc.errors()`), field by field, as every refusal words them."""
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or whole}: {err['msg']}" for err in errors)
