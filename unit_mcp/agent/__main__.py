"""`python -m unit_mcp.agent`: see `cli.py`."""

import sys

from .cli import main

sys.exit(main())
