"""`python -m unit_mcp.agent`: see `_cli.py`."""

import sys

from ._cli import main

sys.exit(main())
