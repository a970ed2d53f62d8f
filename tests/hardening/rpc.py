"""A small raw JSON-RPC client for Streamable HTTP.

It is independent of the SDK's client: it speaks the wire format itself (initialize, the `mcp-session-id`
header, `data:` lines of an event stream), so a sync test (Hypothesis) can drive the real tools over real
HTTP, and transport tests can send what no well-behaved client would.
"""

from __future__ import annotations

import itertools
import json
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import httpx

from unit_mcp.tools import ERROR_META_KEY

PROTOCOL_VERSION = "2025-11-25"
ACCEPT = "application/json, text/event-stream"
JSON_HEADERS = {"Content-Type": "application/json", "Accept": ACCEPT}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
"""The first request of a raw client (no session yet)."""


def messages(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a response, whether sent as JSON or as an event stream."""
    if not response.content:
        return []
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]
    body = response.json()
    return body if isinstance(body, list) else [body]


@dataclass
class ToolOutcome:
    """A tools/call result reduced to what the hardening tests check."""

    is_error: bool
    code: str | None
    text: str
    structured: dict[str, Any] | None
    raw: dict[str, Any]


def outcome(result: dict[str, Any]) -> ToolOutcome:
    error = (result.get("_meta") or {}).get(ERROR_META_KEY) or {}
    text = "\n".join(block.get("text", "") for block in result.get("content", []))
    return ToolOutcome(
        is_error=bool(result.get("isError")),
        code=error.get("code"),
        text=text,
        structured=result.get("structuredContent"),
        raw=result,
    )


class RawMcp:
    """One Streamable HTTP session, driven by hand."""

    def __init__(self, url: str, token: str | None, *, timeout: float = 60) -> None:
        self.url = url
        headers = {"Accept": ACCEPT, "Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        self.http = httpx.Client(headers=headers, timeout=timeout)
        self.session_id: str | None = None
        self._ids = itertools.count(1)

    def __enter__(self) -> RawMcp:
        self.initialize()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def headers(self) -> dict[str, str]:
        if self.session_id is None:
            return {}
        return {"mcp-session-id": self.session_id, "mcp-protocol-version": PROTOCOL_VERSION}

    def post(self, body: bytes | str, headers: dict[str, str] | None = None) -> httpx.Response:
        return self.http.post(self.url, content=body, headers={**self.headers(), **(headers or {})})

    def initialize(self) -> dict[str, Any]:
        params = {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"},
        }
        response = self.post(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}))
        response.raise_for_status()
        self.session_id = response.headers["mcp-session-id"]
        self.post(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})).raise_for_status()
        return messages(response)[0]

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send one request and return its JSON-RPC response message (result or error)."""
        number = next(self._ids)
        response = self.post(json.dumps({"jsonrpc": "2.0", "id": number, "method": method, "params": params}))
        for message in messages(response):
            if message.get("id") == number:
                return message
        raise AssertionError(f"no response to request {number}: HTTP {response.status_code} {response.text[:300]}")

    def call(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        message = self.request("tools/call", {"name": name, "arguments": arguments})
        if "error" in message:
            raise AssertionError(f"{name} failed at the protocol level: {message['error']}")
        return outcome(message["result"])

    def close(self) -> None:
        if self.session_id is not None:
            with suppress(httpx.HTTPError):
                self.http.delete(self.url, headers=self.headers())
            self.session_id = None
        self.http.close()
