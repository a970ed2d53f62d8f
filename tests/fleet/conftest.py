"""The fleet suite drives real `opencode serve` nodes built by the OpenCode suite's stack (the real unit server,
the approval-filtered endpoint, the scripted model); its fixtures (the pinned binary) are shared from there."""

from opencode.conftest import opencode_binary

__all__ = ["opencode_binary"]
