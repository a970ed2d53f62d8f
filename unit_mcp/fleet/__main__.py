"""`python -m unit_mcp.fleet`: the same command as `unit-mcp fleet` (see `_cli.py`)."""

import sys

from ..extras import require_extra

require_extra("agent", "unit-mcp fleet")

from ._cli import main  # noqa: E402  (after the check: it imports the OpenCode client)

sys.exit(main())
