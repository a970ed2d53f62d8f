"""The wire contract of unit-mcp's MCP servers, shared by the server wing and its clients (the agent wing):
what a tool's and a refusal's `_meta` carry, and where the HTTP transports are served. A leaf: imports nothing."""

from __future__ import annotations

from typing import Literal, get_args

Risk = Literal["normal", "filesystem-read", "filesystem-write", "shell", "destructive"]
"""A tool's risk label, lowest first; approval policies are keyed on it."""
RISKS: tuple[Risk, ...] = get_args(Risk)

RISK_META_KEY = "unit_mcp/risk"
"""The key of a listed tool's `_meta` that holds its risk label."""
ERROR_META_KEY = "unit_mcp/error"
"""The key of a refused call's `_meta` that holds the refusal: code, message, hint and details."""

MCP_PATH = "/mcp"
"""Streamable HTTP."""
SSE_PATH = "/sse"
"""The legacy SSE event stream; its client posts its messages to `MESSAGE_PATH`."""
MESSAGE_PATH = "/messages/"
