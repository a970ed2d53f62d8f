"""The agent runner: sessions, turns, approvals and tools for agents that develop units through MCP.

The agent layer reaches the unit tools only as an MCP client (`McpToolSource`), never through the host.
Public names load lazily, so browsing sessions from the command line does not pay for the MCP SDK or
the OpenAI SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AgentApprovals": "approvals",
    "ApprovalDecision": "approvals",
    "ApprovalRequest": "approvals",
    "PendingApprovals": "approvals",
    "Agent": "protocol",
    "TurnContext": "context",
    "delegate": "delegation",
    "delegation_tool": "delegation",
    "ApprovedEndpoint": "endpoint",
    "opencode_config": "endpoint",
    "AgentError": "errors",
    "EndpointError": "errors",
    "EnricherError": "errors",
    "HookError": "errors",
    "SessionCorrupt": "errors",
    "SessionLocked": "errors",
    "SessionNotFound": "errors",
    "StepLimitReached": "errors",
    "ToolError": "errors",
    "ToolFailed": "errors",
    "TurnClosed": "errors",
    "UnknownAgent": "errors",
    "RunnerEvent": "events",
    "events_app": "events",
    "FunctionAgent": "function_agent",
    "Hooks": "hooks",
    "ModelRequest": "hooks",
    "ModelResponse": "hooks",
    "Refusal": "hooks",
    "StepResult": "hooks",
    "ToolCall": "hooks",
    "ToolExecution": "hooks",
    "Inbox": "inbox",
    "Preset": "presets",
    "PresetManager": "presets",
    "ErrorItem": "items",
    "EventItem": "items",
    "Item": "items",
    "MessageItem": "items",
    "Session": "items",
    "SessionMeta": "items",
    "ToolCallItem": "items",
    "ToolResultItem": "items",
    "Usage": "items",
    "LoopAgent": "loop",
    "McpToolSource": "mcpsource",
    "OpenAIAgent": "openai_agent",
    "chat_messages": "projections",
    "display_messages": "projections",
    "AgentRegistry": "registry",
    "AgentRunner": "runner",
    "SessionStore": "sessions",
    "AgentToolSurface": "toolsurface",
    "LocalTool": "toolsurface",
    "ToolDef": "toolsurface",
    "ToolOutput": "toolsurface",
    "openai_tool_name": "toolnames",
    "TurnCallbacks": "turns",
    "TurnController": "turns",
    "TurnHandle": "turns",
    "TurnStatus": "turns",
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
    "EndpointError",
    "EnricherError",
    "ErrorItem",
    "EventItem",
    "FunctionAgent",
    "HookError",
    "Hooks",
    "Inbox",
    "Item",
    "LocalTool",
    "LoopAgent",
    "McpToolSource",
    "MessageItem",
    "ModelRequest",
    "ModelResponse",
    "OpenAIAgent",
    "PendingApprovals",
    "Preset",
    "PresetManager",
    "Refusal",
    "RunnerEvent",
    "Session",
    "SessionCorrupt",
    "SessionLocked",
    "SessionMeta",
    "SessionNotFound",
    "SessionStore",
    "StepLimitReached",
    "StepResult",
    "ToolCall",
    "ToolCallItem",
    "ToolDef",
    "ToolError",
    "ToolExecution",
    "ToolFailed",
    "ToolOutput",
    "ToolResultItem",
    "TurnCallbacks",
    "TurnClosed",
    "TurnContext",
    "TurnController",
    "TurnHandle",
    "TurnStatus",
    "UnknownAgent",
    "Usage",
    "chat_messages",
    "delegate",
    "delegation_tool",
    "display_messages",
    "events_app",
    "openai_tool_name",
    "opencode_config",
]

if TYPE_CHECKING:
    from .approvals import AgentApprovals, ApprovalDecision, ApprovalRequest, PendingApprovals
    from .context import TurnContext
    from .delegation import delegate, delegation_tool
    from .endpoint import ApprovedEndpoint, opencode_config
    from .errors import (
        AgentError,
        EndpointError,
        EnricherError,
        HookError,
        SessionCorrupt,
        SessionLocked,
        SessionNotFound,
        StepLimitReached,
        ToolError,
        ToolFailed,
        TurnClosed,
        UnknownAgent,
    )
    from .events import RunnerEvent, events_app
    from .function_agent import FunctionAgent
    from .hooks import Hooks, ModelRequest, ModelResponse, Refusal, StepResult, ToolCall, ToolExecution
    from .inbox import Inbox
    from .items import (
        ErrorItem,
        EventItem,
        Item,
        MessageItem,
        Session,
        SessionMeta,
        ToolCallItem,
        ToolResultItem,
        Usage,
    )
    from .loop import LoopAgent
    from .mcpsource import McpToolSource
    from .openai_agent import OpenAIAgent
    from .presets import Preset, PresetManager
    from .projections import chat_messages, display_messages
    from .protocol import Agent
    from .registry import AgentRegistry
    from .runner import AgentRunner
    from .sessions import SessionStore
    from .toolnames import openai_tool_name
    from .toolsurface import AgentToolSurface, LocalTool, ToolDef, ToolOutput
    from .turns import TurnCallbacks, TurnController, TurnHandle, TurnStatus


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
