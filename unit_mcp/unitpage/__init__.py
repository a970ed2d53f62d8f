"""The unit server's page: the units and the version each serves, the change log live with each change's diff,
checkpoints with "roll back to here" behind a dry-run preview, and one change reverted. Served by the bridge
beside the MCP endpoints (`python -m unit_mcp.server` prints `UNITS_UI_URL`); the shared page parts (credential,
CSRF/Origin, CSP, script) are `unit_mcp.webpage`.
"""

from .app import PAGE_CALLER, UnitsUI

__all__ = ["PAGE_CALLER", "UnitsUI"]
