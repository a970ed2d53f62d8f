"""`python -m unit_mcp.agent`: the same command as `unit-mcp agent` (see `_cli.py`)."""

import sys

from ..extras import require_extra

require_extra("agent", "unit-mcp agent")

from ._cli import main  # noqa: E402  (after the check: a turn imports the OpenAI and MCP clients)

sys.exit(main())
