"""The agent tests' fixtures (a real unit server over loopback HTTP, the asyncio backend), for the durable tests."""

from agent.conftest import anyio_backend, unit_server

__all__ = ["anyio_backend", "unit_server"]
