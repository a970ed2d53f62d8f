"""OpenCode as an agent provider: a client for `opencode serve` nodes, the node process, and UnitAgent.

`OpenCodeClient` speaks REST to one node and keeps its one `/event` stream; `NodeProcess` runs an isolated
`opencode serve` for the runner; `opencode_endpoint` is the approval-filtered MCP endpoint the node is
configured with; `UnitAgent` drives turns on a node and records what OpenCode did as session items.
"""

from .client import ModelRef, OpenCodeClient, Sent
from .endpoint import OpenCodeEndpoint, OpenCodeView, opencode_endpoint, opencode_tool_name
from .errors import (
    NodeStartError,
    NodeUnavailable,
    OpenCodeError,
    OpenCodeHTTPError,
    OpenCodeNotInstalled,
    UnknownOpenCodeSession,
)
from .events import EventStream, NodeEvent
from .isolation import IsolatedRoot, check_extra_config
from .node import PINNED_VERSION, NodeProcess, find_opencode
from .transcript import Reply, ReplyStep, ToolPart, read_reply
from .unit_agent import SESSION_KEY, UnitAgent

__all__ = [
    "PINNED_VERSION",
    "SESSION_KEY",
    "EventStream",
    "IsolatedRoot",
    "ModelRef",
    "NodeEvent",
    "NodeProcess",
    "NodeStartError",
    "NodeUnavailable",
    "OpenCodeClient",
    "OpenCodeEndpoint",
    "OpenCodeError",
    "OpenCodeHTTPError",
    "OpenCodeNotInstalled",
    "OpenCodeView",
    "Reply",
    "ReplyStep",
    "Sent",
    "ToolPart",
    "UnitAgent",
    "UnknownOpenCodeSession",
    "check_extra_config",
    "find_opencode",
    "opencode_endpoint",
    "opencode_tool_name",
    "read_reply",
]
