"""`python -m unit_mcp`: the `unit-mcp` command."""

import sys

from .cli import main

sys.exit(main())
