"""opencode-fleet: an MCP server that lets a master agent coordinate several `opencode serve` nodes.

    python -m unit_mcp.fleet --node build=http://127.0.0.1:4096 --node review=http://127.0.0.1:4097 [--stdio]

`Fleet` holds one OpenCode client (REST + one shared event stream) and one working session per node;
`FleetTools` serves the `fleet_*` tools over it, with the operating protocol for master agents in the server's
instructions.
"""

from .nodes import Fleet, FleetError, NodeSpec, capability_summary, node_specs
from .server import INSTRUCTIONS, TOOLS, FleetTools

__all__ = ["INSTRUCTIONS", "TOOLS", "Fleet", "FleetError", "FleetTools", "NodeSpec", "capability_summary", "node_specs"]
