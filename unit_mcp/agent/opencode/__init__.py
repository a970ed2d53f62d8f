"""OpenCode as an agent provider: a client for `opencode serve` nodes, the node process, and UnitAgent.

`OpenCodeClient` speaks REST to one node and keeps its one `/event` stream; `NodeProcess` runs an isolated
`opencode serve` for the runner; `opencode_endpoint` is the approval-filtered MCP endpoint the node is
configured with; `UnitAgent` drives turns on a node and records what OpenCode did as session items.
"""

from .client import ModelRef, OpenCodeClient
from .endpoint import OpenCodeEndpoint, OpenCodeView, opencode_endpoint, opencode_tool_name
from .errors import (
    NodeStartError,
    NodeUnavailable,
    OpenCodeError,
    OpenCodeHTTPError,
    OpenCodeNotInstalled,
    UnknownOpenCodeSession,
)
from .isolation import IsolatedRoot
from .node import PINNED_VERSION, NodeProcess, find_opencode
from .unit_agent import SESSION_KEY, UnitAgent

__all__ = [
    "PINNED_VERSION",
    "SESSION_KEY",
    "IsolatedRoot",
    "ModelRef",
    "NodeProcess",
    "NodeStartError",
    "NodeUnavailable",
    "OpenCodeClient",
    "OpenCodeEndpoint",
    "OpenCodeError",
    "OpenCodeHTTPError",
    "OpenCodeNotInstalled",
    "OpenCodeView",
    "UnitAgent",
    "UnknownOpenCodeSession",
    "find_opencode",
    "opencode_endpoint",
    "opencode_tool_name",
]
