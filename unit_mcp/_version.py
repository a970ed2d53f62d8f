"""The package version: a leaf every layer may import (the package face re-exports it)."""

__version__ = "0.1.0"
