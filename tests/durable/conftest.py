"""The agent tests' real unit server over loopback HTTP and the pinned OpenCode and Codex binaries, for the durable
tests."""

from agent.conftest import unit_server
from codex.conftest import codex_binary
from opencode.conftest import opencode_binary

__all__ = ["codex_binary", "opencode_binary", "unit_server"]
