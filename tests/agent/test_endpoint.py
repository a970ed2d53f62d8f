"""The approval-filtered endpoint over real loopback HTTP: guards, isolated config, filtering, list changes."""

from __future__ import annotations

import json
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import pytest
from hardening.rpc import INITIALIZE, JSON_HEADERS
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from unit_mcp.agent import (
    AgentApprovals,
    AgentToolSurface,
    ApprovedEndpoint,
    FunctionAgent,
    McpToolSource,
    ModelRequest,
    ModelResponse,
    TurnContext,
    TurnStatus,
)
from unit_mcp.agent.errors import EndpointError
from unit_mcp.tools import ERROR_META_KEY

from .conftest import UnitServer, endpoint_client, reload, running

pytestmark = pytest.mark.anyio


async def names(connected: Client) -> list[str]:
    return sorted(tool.name for tool in (await connected.list_tools(cache_mode="refresh")).tools)


@asynccontextmanager
async def approved(unit_server: UnitServer, tmp_path: Path, **options: Any) -> AsyncIterator[ApprovedEndpoint]:
    surface = AgentToolSurface(AgentApprovals())
    async with unit_server.source() as source:
        surface.add_source(source)
        async with ApprovedEndpoint(surface, config_root=tmp_path / "agent-opencode", **options) as endpoint:
            yield endpoint


NORMAL = [
    "echo_token",
    "get_nonce",
    "record_value",
    "slow_echo",
    "unit_checkpoint",
    "unit_inspect",
    "unit_list",
    "unit_resolve",
    "unit_snapshot",
    "unit_test_status",
]


async def test_it_writes_an_isolated_deny_all_config_and_reports_its_status(
    unit_server: UnitServer, tmp_path: Path
) -> None:
    extra = {"model": "scripted/m", "permission": {"*": "allow"}, "provider": {"scripted": {"npm": "x"}}}
    async with approved(unit_server, tmp_path, config_extra=extra) as endpoint:
        status = endpoint.status()
        assert status.started and status.host == "127.0.0.1" and status.url == endpoint.url
        assert status.url is not None and status.url.startswith("http://127.0.0.1:") and status.url.endswith("/mcp")
        assert sorted(status.tools) == NORMAL
        assert endpoint.opencode_env() == {"XDG_CONFIG_HOME": str(tmp_path / "agent-opencode")}
        path = tmp_path / "agent-opencode" / "opencode" / "opencode.json"
        assert status.config_path == str(path) and stat.S_IMODE(path.stat().st_mode) == 0o600
        config = json.loads(path.read_text())
        assert config["permission"] == {"*": "deny", "unit-agent_*": "allow"}  # extra cannot loosen it
        assert config["mcp"] == {
            "unit-agent": {
                "type": "remote",
                "url": endpoint.url,
                "enabled": True,
                "oauth": False,
                "headers": {"Authorization": f"Bearer {endpoint.token}"},
            }
        }
        assert config["model"] == "scripted/m" and config["provider"] == {"scripted": {"npm": "x"}}
        assert config["autoupdate"] is False
    assert not endpoint.status().started


async def test_a_temporary_config_root_is_removed_at_stop(unit_server: UnitServer) -> None:
    surface = AgentToolSurface(AgentApprovals())
    async with ApprovedEndpoint(surface) as endpoint:
        root = Path(endpoint.opencode_env()["XDG_CONFIG_HOME"])
        assert (root / "opencode" / "opencode.json").exists()
    assert not root.exists()


async def test_guards_token_host_origin_and_loopback_only(unit_server: UnitServer, tmp_path: Path) -> None:
    async with approved(unit_server, tmp_path) as endpoint:
        assert endpoint.url is not None
        async with httpx2.AsyncClient(timeout=10) as http:
            assert (await http.post(endpoint.url, headers=JSON_HEADERS, json=INITIALIZE)).status_code == 401
            wrong = {**JSON_HEADERS, "Authorization": "Bearer nope"}
            assert (await http.post(endpoint.url, headers=wrong, json=INITIALIZE)).status_code == 401
            good = {**JSON_HEADERS, "Authorization": f"Bearer {endpoint.token}"}
            assert (
                await http.post(endpoint.url, headers={**good, "Host": "evil.example"}, json=INITIALIZE)
            ).status_code == 421
            evil = {**good, "Origin": "http://evil.example"}
            assert (await http.post(endpoint.url, headers=evil, json=INITIALIZE)).status_code == 403
            assert (await http.post(endpoint.url, headers=good, json=INITIALIZE)).status_code == 200
    with pytest.raises(EndpointError, match="loopback only"):
        await ApprovedEndpoint(AgentToolSurface(AgentApprovals()), host="0.0.0.0").start()


async def test_the_users_own_opencode_config_is_never_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The endpoint shares the bridge's config home: a given folder may never be the user's own."""
    own = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(own))
    endpoint = ApprovedEndpoint(AgentToolSurface(AgentApprovals()), config_root=own)
    with pytest.raises(EndpointError, match="own OpenCode config home"):
        await endpoint.start()
    assert not own.exists() and not endpoint.status().started


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_only_approved_tools_are_listed_and_callable(unit_server: UnitServer, tmp_path: Path, mode: str) -> None:
    async with approved(unit_server, tmp_path) as endpoint, endpoint_client(endpoint, mode) as connected:
        listed = (await connected.list_tools()).tools
        assert sorted(tool.name for tool in listed) == NORMAL
        assert all(tool.meta == {"unit_mcp/risk": "normal"} for tool in listed)
        echoed = await connected.call_tool("echo_token", {"token": "through-the-endpoint"})
        assert not echoed.is_error and echoed.content[0].text == "through-the-endpoint"  # type: ignore[union-attr]
        refused = await connected.call_tool("unit_reload", {"unit_id": "counter"})
        assert refused.is_error and "not an approved tool" in refused.content[0].text  # type: ignore[union-attr]
    assert unit_server.called() == ["echo_token"]


async def test_endpoint_grants_widen_what_is_listed_and_callable(unit_server: UnitServer, tmp_path: Path) -> None:
    async with (
        approved(unit_server, tmp_path, grants=["filesystem-read"]) as endpoint,
        endpoint_client(endpoint) as connected,
    ):
        assert "unit_read_source" in await names(connected)
        read = await connected.call_tool("unit_read_source", {"unit_id": "greeter", "source_id": "greeter.py"})
        assert not read.is_error and read.structured_content is not None
        assert "unit_reload" not in await names(connected)
    assert unit_server.called() == ["unit_read_source"]


async def test_legacy_sse_clients_are_served_too(unit_server: UnitServer, tmp_path: Path) -> None:
    async with approved(unit_server, tmp_path) as endpoint:
        assert endpoint.sse_url is not None
        headers = {"Authorization": f"Bearer {endpoint.token}"}
        async with Client(sse_client(endpoint.sse_url, headers=headers), mode="legacy") as connected:
            assert await names(connected) == NORMAL


async def test_policy_changes_reach_connected_clients_of_both_eras(unit_server: UnitServer, tmp_path: Path) -> None:
    notified = anyio.Event()

    async with (
        approved(unit_server, tmp_path) as endpoint,
        endpoint_client(endpoint, "legacy", tools_changed=notified) as legacy,
        endpoint_client(endpoint, "auto") as modern,
    ):
        assert await names(legacy) == NORMAL
        async with modern.listen(tools_list_changed=True) as subscription:
            endpoint.approvals.set_policy("filesystem-read", "auto")
            with anyio.fail_after(5):
                await notified.wait()
                async for _event in subscription:
                    break
        # unit_apply_patch, unit_rollback and unit_revert_change too: their dry runs need only filesystem-read (a
        # write is still refused per call)
        dry_runs = ["unit_apply_patch", "unit_revert_change", "unit_rollback"]
        expected = sorted([*NORMAL, *dry_runs, "unit_changes", "unit_read_log", "unit_read_source"])
        assert await names(legacy) == await names(modern) == expected


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_downstream_surface_refreshes_on_list_changed(
    unit_server: UnitServer, tmp_path: Path, mode: str
) -> None:
    """The upstream side of the surface: a surface fed by this endpoint follows its policy changes."""
    async with approved(unit_server, tmp_path) as endpoint:
        assert endpoint.url is not None
        downstream = AgentToolSurface(AgentApprovals({"shell": "auto"}))
        async with McpToolSource(endpoint.url, token=endpoint.token, mode=mode, name="agent") as source:  # type: ignore[arg-type]
            downstream.add_source(source)
            assert "unit_run_tests" not in {tool.name for tool in downstream.tools()}
            changed = anyio.Event()
            downstream.on_change(changed.set)
            endpoint.approvals.set_policy("shell", "auto")
            with anyio.fail_after(5):
                await changed.wait()
            assert {"unit_run_tests", "unit_reload"} <= {tool.name for tool in downstream.visible()}


async def test_a_server_that_goes_away_fails_the_turn_not_the_runner(tmp_path: Path) -> None:
    upstream = AgentToolSurface(AgentApprovals())

    @upstream.tool
    def ping() -> str:
        return "pong"

    endpoint = ApprovedEndpoint(upstream, config_root=tmp_path / "c")
    stop, stopped = anyio.Event(), anyio.Event()

    async def serve(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with endpoint:
            task_status.started()
            await stop.wait()
        stopped.set()

    def model(request: ModelRequest, ctx: TurnContext) -> ModelResponse | str:
        return ModelResponse.calling(("ping", {})) if request.messages[-1]["role"] == "user" else "answered"

    surface = AgentToolSurface(AgentApprovals())
    async with anyio.create_task_group() as tg:
        await tg.start(serve)
        assert endpoint.url is not None
        async with (
            McpToolSource(endpoint.url, token=endpoint.token, name="remote", timeout=2) as source,
            running(tmp_path, {"f": lambda deps: FunctionAgent(model, id="f")}, surface=surface) as runner,
        ):
            surface.add_source(source)
            session = await runner.create_session("f")
            assert (await (await runner.run_turn(session.id, "one")).wait(5)).status is TurnStatus.COMPLETED
            stop.set()
            await stopped.wait()
            lost = await (await runner.run_turn(session.id, "two")).wait(10)
            assert lost.status is TurnStatus.FAILED and (lost.error or "").startswith(
                "ToolFailed: MCP tool ping on remote"
            )
            surface.remove_source("remote")

            @surface.tool
            def ping() -> str:
                return "local pong"

            assert (await (await runner.run_turn(session.id, "three")).wait(5)).status is TurnStatus.COMPLETED
    items = reload(tmp_path, session.id)
    assert items.open_tool_calls() == []


async def test_a_failed_tool_call_keeps_the_servers_error_meta_through_the_endpoint(
    unit_server: UnitServer, tmp_path: Path
) -> None:
    arguments = {"unit_id": "no_such_unit"}
    headers = {"Authorization": f"Bearer {unit_server.token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(10, read=60)) as http,
        Client(streamable_http_client(unit_server.url, http_client=http)) as direct,
    ):
        through_bridge = await direct.call_tool("unit_inspect", arguments)
    async with approved(unit_server, tmp_path) as endpoint, endpoint_client(endpoint) as connected:
        through_endpoint = await connected.call_tool("unit_inspect", arguments)
    assert through_bridge.is_error and through_endpoint.is_error
    error = (through_bridge.meta or {}).get(ERROR_META_KEY)
    assert isinstance(error, dict) and error["code"] and error["hint"], through_bridge
    assert through_endpoint.meta == through_bridge.meta
    assert through_endpoint.content == through_bridge.content
