"""The agent tests' real unit server over loopback HTTP and the pinned OpenCode binary, for the durable tests."""

from agent.conftest import unit_server
from opencode.conftest import opencode_binary

__all__ = ["opencode_binary", "unit_server"]
