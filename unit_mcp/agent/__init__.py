"""The agent runner: sessions, turns, approvals and tools for agents that develop units through MCP.

The agent layer reaches the unit tools only as an MCP client (`McpToolSource`), never through the host.
This face holds what a user of the runner needs; everything else is imported from its module (items from
`unit_mcp.agent.items`, hook types from `.hooks`, errors from `.errors`, …). Public names load lazily, so
browsing sessions from the command line does not pay for the MCP SDK or the OpenAI SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "AgentRunner": "_runner",
    "DurableClient": "_durable",
    "DurableWorker": "_durable",
    "Answered": "_runner",
    "AgentRegistry": "_registry",
    "AgentToolSurface": "toolsurface",
    "LocalTool": "toolsurface",
    "ToolOutput": "toolsurface",
    "McpToolSource": "_mcpsource",
    "AgentApprovals": "approvals",
    "ApprovalDecision": "approvals",
    "ApprovalRequest": "approvals",
    "PendingApprovals": "approvals",
    "Agent": "_protocol",
    "TurnContext": "_context",
    "LoopAgent": "_loop",
    "FunctionAgent": "_function_agent",
    "OpenAIAgent": "_openai_agent",
    "Hooks": "hooks",
    "ModelRequest": "hooks",
    "ModelResponse": "hooks",
    "delegate": "_delegation",
    "delegation_tool": "_delegation",
    "ApprovedEndpoint": "_endpoint",
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
    "Answered",
    "ApprovalDecision",
    "ApprovalRequest",
    "ApprovedEndpoint",
    "DurableClient",
    "DurableWorker",
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
    "delegate",
    "delegation_tool",
    "events_app",
]

if TYPE_CHECKING:
    from ._context import TurnContext
    from ._delegation import delegate, delegation_tool
    from ._durable import DurableClient, DurableWorker
    from ._endpoint import ApprovedEndpoint
    from ._function_agent import FunctionAgent
    from ._loop import LoopAgent
    from ._mcpsource import McpToolSource
    from ._openai_agent import OpenAIAgent
    from ._protocol import Agent
    from ._registry import AgentRegistry
    from ._runner import AgentRunner, Answered
    from .approvals import AgentApprovals, ApprovalDecision, ApprovalRequest, PendingApprovals
    from .errors import AgentError, ToolError
    from .events import events_app
    from .hooks import Hooks, ModelRequest, ModelResponse
    from .sessions import SessionStore
    from .toolsurface import AgentToolSurface, LocalTool, ToolOutput
    from .turns import TurnHandle, TurnStatus


__getattr__ = lazy_exports(__name__, _EXPORTS)
