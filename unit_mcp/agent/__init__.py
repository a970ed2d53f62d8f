"""The agent runner: sessions, turns, approvals and tools for agents that develop units through MCP.

The agent layer reaches the unit tools only as an MCP client (`McpToolSource`), never through the host.
See the README section "Agent runner" for a walk-through.
"""

from .approvals import AgentApprovals, ApprovalDecision, ApprovalRequest
from .context import Agent, TurnContext
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
from .function_agent import FunctionAgent
from .hooks import Hooks, ModelRequest, ModelResponse, Refusal, StepResult, ToolCall
from .inbox import Inbox
from .items import ErrorItem, EventItem, Item, MessageItem, Session, SessionMeta, ToolCallItem, ToolResultItem, Usage
from .loop import LoopAgent
from .mcpsource import McpToolSource
from .openai_agent import OpenAIAgent
from .projections import chat_messages, display_messages
from .registry import AgentRegistry
from .runner import AgentRunner
from .sessions import SessionStore
from .toolsurface import AgentToolSurface, LocalTool, ToolDef, ToolOutput, openai_tool_name
from .turns import TurnCallbacks, TurnController, TurnHandle, TurnStatus

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
    "Refusal",
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
    "openai_tool_name",
    "opencode_config",
]
