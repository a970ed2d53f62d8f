"""What tests check of the OpenCode provider below its face: `message_id_after`, the id a prompt is sent under
(minted as OpenCode mints its own, so a prompt sent again is taken once). An internal of
`unit_mcp.agent.opencode._client`: tests reach it here only."""

from __future__ import annotations

from unit_mcp.agent.opencode._client import message_id_after

__all__ = ["message_id_after"]
