"""The SDK's own client over real HTTP, and the checks every refusal must pass."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from .rpc import ToolOutcome, outcome

REPO = Path(__file__).resolve().parents[2]


@asynccontextmanager
async def connect(url: str, token: str | None, *, mode: str = "auto") -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60, read=300)) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,  # type: ignore[arg-type]
    ):
        yield client


async def call(client: Client, name: str, arguments: dict[str, Any]) -> ToolOutcome:
    result: types.CallToolResult = await client.call_tool(name, arguments)
    return outcome(result.model_dump(mode="json", by_alias=True, exclude_none=True))


def host_paths(*extra: Path) -> list[str]:
    """Absolute paths of this machine that no client-visible text may contain."""
    candidates = {str(path) for path in extra} | {os.path.realpath(path) for path in extra}
    candidates |= {str(REPO), sys.prefix, tempfile.gettempdir() + "/"}
    home = str(Path.home())
    if home not in ("/", ""):
        candidates.add(home + "/")
    return sorted(candidate for candidate in candidates if len(candidate) > 1)


def leaks(texts: Iterable[str], forbidden: Iterable[str]) -> list[str]:
    """The forbidden strings (host paths, sentinel secrets) found in any of the texts."""
    joined = "\n".join(texts)
    return [item for item in forbidden if item in joined]


def visible(result: ToolOutcome) -> str:
    """Everything a client sees of a result: text blocks, error meta and structured content."""
    return result.text + json.dumps(result.raw, ensure_ascii=False)
