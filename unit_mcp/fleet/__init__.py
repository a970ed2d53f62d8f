"""opencode-fleet: an MCP server that lets a master agent coordinate several `opencode serve` nodes.

`Fleet` holds one OpenCode client and one working session per node; `FleetTools` serves the `fleet_*` tools over
it (usage: docs/fleet.md). Names load lazily, so `python -m unit_mcp.fleet` can name a missing extra first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "Fleet": "nodes",
    "FleetError": "nodes",
    "NodeSpec": "nodes",
    "capability_summary": "nodes",
    "node_specs": "nodes",
    "INSTRUCTIONS": "server",
    "TOOLS": "server",
    "FleetTools": "server",
}
__all__ = ["INSTRUCTIONS", "TOOLS", "Fleet", "FleetError", "FleetTools", "NodeSpec", "capability_summary", "node_specs"]

if TYPE_CHECKING:
    from .nodes import Fleet, FleetError, NodeSpec, capability_summary, node_specs
    from .server import INSTRUCTIONS, TOOLS, FleetTools


__getattr__ = lazy_exports(__name__, _EXPORTS)
