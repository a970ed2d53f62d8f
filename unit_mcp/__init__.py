"""unit-mcp: develop a running Python application's hot-reloadable units through risk-labelled MCP tools."""

from .errors import UnitError
from .host import Host, ReloadError
from .service import UnitService

__all__ = ["Host", "ReloadError", "UnitError", "UnitService"]
__version__ = "0.1.0"
