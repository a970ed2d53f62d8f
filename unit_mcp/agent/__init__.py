"""The agent runner: sessions, turns, approvals and tools for agents that develop units through MCP.

The agent layer reaches the unit tools only as an MCP client (`McpToolSource`), never through the host.
This face holds what a user of the runner needs; everything else is imported from its module (items from
`unit_mcp.agent.items`, hook types from `.hooks`, errors from `.errors`, …). Public names load lazily, so
browsing sessions from the command line does not pay for the MCP SDK or the OpenAI SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AgentRunner": "runner",
    "AgentRegistry": "registry",
    "AgentToolSurface": "toolsurface",
    "LocalTool": "toolsurface",
    "ToolOutput": "toolsurface",
    "McpToolSource": "mcpsource",
    "AgentApprovals": "approvals",
    "ApprovalDecision": "approvals",
    "ApprovalRequest": "approvals",
    "PendingApprovals": "approvals",
    "Agent": "protocol",
    "TurnContext": "context",
    "LoopAgent": "loop",
    "FunctionAgent": "function_agent",
    "OpenAIAgent": "openai_agent",
    "Hooks": "hooks",
    "ModelRequest": "hooks",
    "ModelResponse": "hooks",
    "delegation_tool": "delegation",
    "ApprovedEndpoint": "endpoint",
    "SessionStore": "sessions",
    "TurnHandle": "turns",
    "TurnStatus": "turns",
    "events_app": "events",
    "AgentError": "errors",
    "ToolError": "errors",
}
__all__ = [
    "Agent",
    "AgentApprovals",
    "AgentError",
    "AgentRegistry",
    "AgentRunner",
    "AgentToolSurface",
    "ApprovalDecision",
    "ApprovalRequest",
    "ApprovedEndpoint",
    "FunctionAgent",
    "Hooks",
    "LocalTool",
    "LoopAgent",
    "McpToolSource",
    "ModelRequest",
    "ModelResponse",
    "OpenAIAgent",
    "PendingApprovals",
    "SessionStore",
    "ToolError",
    "ToolOutput",
    "TurnContext",
    "TurnHandle",
    "TurnStatus",
    "delegation_tool",
    "events_app",
]

if TYPE_CHECKING:
    from .approvals import AgentApprovals, ApprovalDecision, ApprovalRequest, PendingApprovals
    from .context import TurnContext
    from .delegation import delegation_tool
    from .endpoint import ApprovedEndpoint
    from .errors import AgentError, ToolError
    from .events import events_app
    from .function_agent import FunctionAgent
    from .hooks import Hooks, ModelRequest, ModelResponse
    from .loop import LoopAgent
    from .mcpsource import McpToolSource
    from .openai_agent import OpenAIAgent
    from .protocol import Agent
    from .registry import AgentRegistry
    from .runner import AgentRunner
    from .sessions import SessionStore
    from .toolsurface import AgentToolSurface, LocalTool, ToolOutput
    from .turns import TurnHandle, TurnStatus


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
