"""unit-mcp: develop a running Python application's hot-reloadable units through risk-labelled MCP tools.

The public names load lazily, so a test subprocess that needs only the host does not pay for the
service, the MCP SDK or the HTTP stack; and the SDK's packages run their `__init__` (its whole client) only
for a caller that asks for a name it defines (`_lazy.lean_packages`), so a server imports no client module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports, lean_packages
from ._version import __version__ as __version__

lean_packages()  # the MCP SDK's package `__init__`s import its client: only when a caller asks for it

_EXPORTS = {
    "Confirmations": "confirm",
    "Host": "host",
    "ReloadError": "reloading",
    "UnitNotLoaded": "host",
    "UnitError": "errors",
    "UnitService": "service",
    "UnitTools": "tools",
    "UnitsUI": "unitpage",
    "tool_risks": "tools",
    "Bridge": "bridge",
    "BridgeError": "bridge",
}
__all__ = [
    "Bridge",
    "BridgeError",
    "Confirmations",
    "Host",
    "ReloadError",
    "UnitError",
    "UnitNotLoaded",
    "UnitService",
    "UnitTools",
    "UnitsUI",
    "tool_risks",
]

if TYPE_CHECKING:
    from .bridge import Bridge, BridgeError
    from .confirm import Confirmations
    from .errors import UnitError
    from .host import Host, UnitNotLoaded
    from .reloading import ReloadError
    from .service import UnitService
    from .tools import UnitTools, tool_risks
    from .unitpage import UnitsUI


__getattr__ = lazy_exports(__name__, _EXPORTS)
