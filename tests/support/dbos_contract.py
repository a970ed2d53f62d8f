"""What the durable turns take from DBOS beyond its public API, for `tests/durable/test_dbos_contract.py` to pin:
`recover` (DBOS's private `_recover_pending_workflows`) and `sqlite_engine` (the system database engine built to
DBOS's own settings). Both are internals of `unit_mcp.agent._durable`: tests reach them here only."""

from __future__ import annotations

from unit_mcp.agent._durable import recover, sqlite_engine

__all__ = ["recover", "sqlite_engine"]
