"""The agent tests' real unit server over loopback HTTP, for the durable tests."""

from agent.conftest import unit_server

__all__ = ["unit_server"]
