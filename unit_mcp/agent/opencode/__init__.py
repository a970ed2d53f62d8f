"""OpenCode as an agent provider: a client for `opencode serve` nodes, the node process, and OpenCodeAgent.

`OpenCodeClient` speaks REST to one node and keeps its one `/event` stream; `NodeProcess` runs an isolated
`opencode serve` for the runner; `opencode_endpoint` is the approval-filtered MCP endpoint the node is
configured with; `OpenCodeAgent` drives turns on a node and records what OpenCode did as session items.
`NodeEvent` is what `OpenCodeClient.listen` streams; `read_reply` reads a reply out of `OpenCodeClient.messages`
as the agent records it (`tool_part`: one tool part).
"""

from ._agent import SESSION_KEY, OpenCodeAgent
from ._client import ModelRef, OpenCodeClient
from ._endpoint import OpenCodeEndpoint, OpenCodeView, opencode_endpoint, opencode_tool_name
from ._errors import (
    NodeStartError,
    NodeUnavailable,
    OpenCodeError,
    OpenCodeHTTPError,
    OpenCodeNotInstalled,
    UnknownOpenCodeSession,
)
from ._event_stream import NodeEvent
from ._isolation import IsolatedRoot
from ._node import PINNED_VERSION, NodeProcess, find_opencode
from ._transcript import Reply, read_reply, tool_part

__all__ = [
    "PINNED_VERSION",
    "SESSION_KEY",
    "IsolatedRoot",
    "ModelRef",
    "NodeEvent",
    "NodeProcess",
    "NodeStartError",
    "NodeUnavailable",
    "OpenCodeAgent",
    "OpenCodeClient",
    "OpenCodeEndpoint",
    "OpenCodeError",
    "OpenCodeHTTPError",
    "OpenCodeNotInstalled",
    "OpenCodeView",
    "Reply",
    "UnknownOpenCodeSession",
    "find_opencode",
    "opencode_endpoint",
    "opencode_tool_name",
    "read_reply",
    "tool_part",
]
