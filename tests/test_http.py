"""The bridge over real HTTP on loopback: uvicorn serving Streamable HTTP (both protocol eras) and legacy
SSE, driven by the SDK's own client; the guards (token, Host, Origin, loopback-only); the isolated
OpenCode config; and the real `python -m unit_mcp.server` process, stopped by a signal."""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import jsonschema
import mcp_types as types
import pytest
from hardening.rpc import INITIALIZE, JSON_HEADERS
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from support.server_process import ServerProcess

from unit_mcp import UnitService
from unit_mcp.bridge import Bridge, BridgeError
from unit_mcp.tools import RISK_META_KEY, TOOLS, UnitTools, tool_risks

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parent.parent
TRANSPORTS = ["streamable-http", "streamable-http-legacy", "sse-legacy"]


@pytest.fixture
def tools(service: UnitService) -> UnitTools:
    return UnitTools(service, progress_interval=0.1)


@asynccontextmanager
async def connect(bridge: Bridge, transport: str, token: str | None = None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token or bridge.token}"}
    if transport == "sse-legacy":
        assert bridge.sse_url is not None
        async with Client(sse_client(bridge.sse_url, headers=headers), mode="legacy") as client:
            yield client
        return
    assert bridge.url is not None
    mode = "legacy" if transport == "streamable-http-legacy" else "auto"
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http,
        Client(streamable_http_client(bridge.url, http_client=http), mode=mode) as client,
    ):
        yield client


async def post(url: str | None, headers: dict[str, str], body: Any = INITIALIZE) -> httpx2.Response:
    assert url is not None
    async with httpx2.AsyncClient(timeout=10) as http:
        return await http.post(url, headers=headers, json=body)


def auth(bridge: Bridge) -> dict[str, str]:
    return {**JSON_HEADERS, "Authorization": f"Bearer {bridge.token}"}


# -- the tools over every transport ----------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_every_tool_over_http(tools: UnitTools, units_root: Path, transport: str) -> None:
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with Bridge(tools.server()) as bridge, connect(bridge, transport) as client:
        listed = (await client.list_tools()).tools
        assert {tool.name: (tool.meta or {}).get(RISK_META_KEY) for tool in listed} == tool_risks()
        assert all(tool.annotations and tool.annotations.open_world_hint is False for tool in listed)
        schemas = {tool.name: tool.output_schema for tool in listed}

        async def ok(name: str, arguments: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
            result = await client.call_tool(name, arguments, **kwargs)
            assert not result.is_error, result.content
            jsonschema.validate(result.structured_content, schemas[name])
            return dict(result.structured_content)

        async def refused(name: str, arguments: dict[str, Any], code: str) -> None:
            result = await client.call_tool(name, arguments)
            text = result.content[0]
            assert result.is_error and isinstance(text, types.TextContent) and text.text.startswith(f"[{code}]")
            assert str(units_root) not in text.text

        assert "counter" in [unit["unit_id"] for unit in (await ok("unit_list", {}))["units"]]
        assert (await ok("unit_resolve", {"description": "weather forecast"}))["candidates"][0]["unit_id"] == "weather"
        assert (await ok("unit_inspect", {"unit_id": "counter"}))["lifecycle"]["snapshot"] == "snapshot"
        read = await ok("unit_read_source", {"unit_id": "counter", "source_id": "__init__.py"})
        arguments = {"unit_id": "counter", "source_id": "__init__.py", "old": "step = 1", "new": "step = 5"}
        edited = await ok("unit_apply_patch", {**arguments, "expected_hash": read["hash"]})
        assert edited["reload"]["reloaded"] and "step = 5" in (units_root / "counter" / "__init__.py").read_text()
        await refused("unit_apply_patch", {**arguments, "expected_hash": read["hash"]}, "stale_hash")
        slow = "import time\n\n\ndef main():\n    time.sleep(0.5)\n"
        await ok("unit_create_source", {"unit_id": "counter", "source_id": "test_slow.py", "source": slow})
        run = await ok("unit_run_tests", {"unit_id": "counter", "test_name": "slow"}, progress_callback=on_progress)
        assert run["passed"] and len(progress) >= 2
        assert (await ok("unit_reload", {"unit_id": "counter"}))["restored_state"] is True
        assert (await ok("unit_read_log", {"grep": "counter"}))["returned"] >= 1
        snap = await ok("unit_snapshot", {"unit_id": "counter"})
        assert snap["state"] == {"count": 0}
        tools.service.host.module("counter").increment()
        restored = await ok("unit_restore_snapshot", {"unit_id": "counter", "snapshot_id": snap["snapshot_id"]})
        assert restored["restored"] and (await ok("unit_snapshot", {"unit_id": "counter"}))["state"] == {"count": 0}
        await refused("unit_inspect", {"unit_id": "nope"}, "unknown_unit")
        await refused("unit_read_source", {"unit_id": "counter", "source_id": "../../x"}, "invalid_source_id")
        await refused("unit_read_source", {"unit_id": "counter"}, "invalid_argument")
        with pytest.raises(MCPError, match="Unknown tool"):
            await client.call_tool("unit_explode", {})
        assert not (await client.call_tool("unit_list", {})).is_error, "the server keeps serving"


async def test_both_transports_serve_clients_at_the_same_time(tools: UnitTools) -> None:
    async with (
        Bridge(tools.server()) as bridge,
        connect(bridge, "streamable-http") as modern,
        connect(bridge, "sse-legacy") as legacy,
    ):
        assert modern.protocol_version != legacy.protocol_version
        a = await modern.call_tool("unit_inspect", {"unit_id": "greeter"})
        b = await legacy.call_tool("unit_inspect", {"unit_id": "greeter"})
        assert a.structured_content == b.structured_content


# -- the guards ------------------------------------------------------------------------------------------


async def test_every_mcp_endpoint_wants_the_token(tools: UnitTools) -> None:
    async with Bridge(tools.server()) as bridge:
        assert bridge.token and len(bridge.token) >= 32
        missing = await post(bridge.url, JSON_HEADERS)
        wrong = await post(bridge.url, {**JSON_HEADERS, "Authorization": "Bearer " + "x" * len(bridge.token)})
        basic = await post(bridge.url, {**JSON_HEADERS, "Authorization": f"Basic {bridge.token}"})
        message = await post(bridge.sse_url.replace("/sse", "/messages/?session_id=0"), JSON_HEADERS)  # type: ignore[union-attr]
        async with httpx2.AsyncClient(timeout=10) as http:
            sse = await http.get(bridge.sse_url)  # type: ignore[arg-type]
        for response in (missing, wrong, basic, message, sse):
            assert response.status_code == 401
            assert response.headers["www-authenticate"].startswith("Bearer")
            assert "text/plain" in response.headers["content-type"]
        lower = await post(bridge.url, {**JSON_HEADERS, "Authorization": f"bearer {bridge.token}"})
        assert lower.status_code == 200
        with pytest.raises(ExceptionGroup) as refused:
            async with connect(bridge, "streamable-http", token="wrong"):
                pass
        assert refused.group_contains(MCPError)
        with pytest.raises(httpx2.HTTPStatusError, match="401"):
            async with connect(bridge, "sse-legacy", token="wrong"):
                pass


async def test_dns_rebinding_is_refused(tools: UnitTools) -> None:
    async with Bridge(tools.server()) as bridge:
        port = bridge.status().port
        assert (await post(bridge.url, {**auth(bridge), "Host": "evil.example:80"})).status_code == 421
        assert (await post(bridge.url, {**auth(bridge), "Host": f"127.0.0.1:{port + 1}"})).status_code == 421
        assert (await post(bridge.url, {**auth(bridge), "Origin": "http://evil.example"})).status_code == 403
        assert (await post(bridge.url, {**auth(bridge), "Origin": "null"})).status_code == 403
        async with httpx2.AsyncClient(timeout=10) as http:
            sse = await http.get(bridge.sse_url, headers={**auth(bridge), "Host": "evil.example"})  # type: ignore[arg-type]
        assert sse.status_code == 421
        no_token = await post(bridge.url, {**JSON_HEADERS, "Host": "evil.example"})
        assert no_token.status_code == 421, "rebinding is refused before the token is even looked at"
        local = {**auth(bridge), "Host": f"localhost:{port}", "Origin": "http://localhost:6274"}
        assert (await post(bridge.url, local)).status_code == 200


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "192.168.1.20", "10.0.0.1", "example.com", ""])
def test_non_loopback_host_is_refused_at_start(tools: UnitTools, address: str) -> None:
    with pytest.raises(BridgeError, match="loopback only"):
        Bridge(tools.server(), host=address)


async def test_auth_off_serves_without_token_but_still_guards_hosts(
    tools: UnitTools, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="unit_mcp.bridge"):
        async with Bridge(tools.server(), auth=False) as bridge:
            assert bridge.token is None
            assert (await post(bridge.url, JSON_HEADERS)).status_code == 200
            assert (await post(bridge.url, {**JSON_HEADERS, "Host": "evil.example"})).status_code == 421
            config = json.loads(Path(bridge.status().config_path or "").read_text())
    assert "headers" not in config["mcp"]["unit-dev"]
    assert "authentication is off" in caplog.text


# -- the isolated OpenCode config and the bridge's life cycle ------------------------------------------


async def test_opencode_config_denies_everything_but_this_server(tools: UnitTools) -> None:
    async with Bridge(tools.server(), server_name="units-here") as bridge:
        status, token = bridge.status(), bridge.token
        assert status.started and status.host == "127.0.0.1" and status.port
        assert status.url == f"http://127.0.0.1:{status.port}/mcp"
        assert status.sse_url == f"http://127.0.0.1:{status.port}/sse"
        path = Path(status.config_path or "")
        assert path == Path(status.config_root or "") / "opencode" / "opencode.json"
        assert bridge.opencode_env() == {"XDG_CONFIG_HOME": status.config_root}
        config = json.loads(path.read_text())
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert sorted(os.listdir(path.parent)) == ["opencode.json"], "no temporary file left behind"
    assert config == {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "formatter": False,
        "lsp": False,
        "permission": {"*": "deny", "units-here_*": "allow"},
        "mcp": {
            "units-here": {
                "type": "remote",
                "url": status.url,
                "enabled": True,
                "oauth": False,
                "headers": {"Authorization": f"Bearer {token}"},
            }
        },
    }
    assert list(config["permission"]) == ["*", "units-here_*"], "the allow rule comes last, so it wins"
    assert not Path(status.config_root or "").exists(), "a temporary config root is removed at stop"


async def test_given_config_root_is_kept_and_rewritten_per_run(tools: UnitTools, tmp_path: Path) -> None:
    root = tmp_path / "oc"
    bridge = Bridge(tools.server(), config_root=root)
    first = await bridge.start()
    assert await bridge.start() == first, "start is idempotent"
    token = bridge.token
    await bridge.stop()
    await bridge.stop()
    assert not bridge.status().started and bridge.status().url is None and bridge.token is None
    assert (root / "opencode" / "opencode.json").is_file()
    async with bridge:
        config = json.loads((root / "opencode" / "opencode.json").read_text())
        assert config["mcp"]["unit-dev"]["url"] == bridge.url
        assert bridge.token != token
        assert (await post(bridge.url, auth(bridge))).status_code == 200


async def test_the_users_own_opencode_config_is_never_written(
    tools: UnitTools, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(own))
    with pytest.raises(BridgeError, match="own OpenCode config"):
        await Bridge(tools.server(), config_root=own).start()
    assert not own.exists()


async def test_a_port_in_use_fails_loudly(tools: UnitTools, tmp_path: Path) -> None:
    async with Bridge(tools.server()) as first:
        busy = Bridge(tools.server(), port=first.status().port or 0, config_root=tmp_path / "oc")
        with pytest.raises(BridgeError, match="cannot listen"):
            await busy.start()
        assert not busy.status().started and not (tmp_path / "oc").exists()


async def test_an_unwritable_config_root_fails_loudly(tools: UnitTools, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    bridge = Bridge(tools.server(), config_root=blocker)
    with pytest.raises(BridgeError, match="cannot write the OpenCode config"):
        await bridge.start()
    assert not bridge.status().started


# -- the real entry point --------------------------------------------------------------------------------


async def test_entry_point_prints_its_lines_serves_and_stops_on_sigterm(
    tmp_path: Path, server_processes: list[ServerProcess]
) -> None:
    process = ServerProcess("--no-watch", tmp=tmp_path)
    server_processes.append(process)
    printed = process.ready()
    assert list(printed) == [
        "MCP_URL",
        "MCP_SSE_URL",
        "MCP_TOKEN",
        "OPENCODE_XDG_CONFIG_HOME",
        *("OPENCODE_CMD", "CLAUDE_CMD", "GEMINI_CLI_HOME", "CURSOR_MCP_JSON", "VSCODE_MCP_JSON", "INSPECTOR_CMD"),
        "UNITS_UI_URL_FILE",
        "XDG_CONFIG_HOME",
    ]
    root = Path(printed["OPENCODE_XDG_CONFIG_HOME"])
    assert printed["XDG_CONFIG_HOME"] == f"{root} opencode"
    assert printed["MCP_URL"].startswith("http://127.0.0.1:") and printed["MCP_URL"].endswith("/mcp")
    assert printed["MCP_SSE_URL"] == printed["MCP_URL"].removesuffix("/mcp") + "/sse"
    config = json.loads((root / "opencode" / "opencode.json").read_text())
    assert config["mcp"]["unit-dev"]["headers"]["Authorization"] == f"Bearer {printed['MCP_TOKEN']}"
    data_dir = root.parent
    assert data_dir.parent == tmp_path, "the private data (and example copy) live in a temporary folder"
    headers = {"Authorization": f"Bearer {printed['MCP_TOKEN']}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http,
        Client(streamable_http_client(printed["MCP_URL"], http_client=http), mode="legacy") as client,
    ):
        read = await client.call_tool("unit_read_source", {"unit_id": "greeter", "source_id": "greeter.py"})
        assert not read.is_error and "def greet" in read.structured_content["content"]
        assert str(data_dir) not in json.dumps(read.model_dump(mode="json"))
    assert (data_dir / "example-units" / "greeter.py").is_file()
    assert process.stop(signal.SIGTERM) == 0
    assert not data_dir.exists(), "temporary data is removed at exit"
    assert (REPO / "unit_mcp" / "examples" / "units" / "greeter.py").is_file()


async def test_entry_point_with_options_keeps_its_data_dir_on_sigint(
    tmp_path: Path, server_processes: list[ServerProcess]
) -> None:
    data = tmp_path / "data"
    process = ServerProcess(
        "--data-dir", str(data), "--tool-prefix", "space_", "--server-name", "space-unit-dev", "--no-auth",
        tmp=tmp_path,
    )  # fmt: skip
    server_processes.append(process)
    printed = process.ready()
    assert "MCP_TOKEN" not in printed
    async with Client(sse_client(printed["MCP_SSE_URL"]), mode="legacy") as client:
        names = [tool.name for tool in (await client.list_tools()).tools]
    assert names[0] == "space_unit_list" and len(names) == len(TOOLS)
    config = json.loads((data / "opencode-config" / "opencode" / "opencode.json").read_text())
    assert list(config["mcp"]) == ["space-unit-dev"] and "space-unit-dev_*" in config["permission"]
    assert process.stop(signal.SIGINT) == 0
    assert (data / "example-units" / "counter").is_dir()
    assert "counter dropped at" in (data / "logs" / "app.log").read_text(), "units are dropped at exit"
    assert "authentication is off" in process.stderr()


@pytest.mark.parametrize(("args", "message"), [(["--host", "0.0.0.0"], "loopback"), (["--port", "70000"], "port")])
def test_entry_point_refuses_bad_options(tmp_path: Path, args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "unit_mcp.server", *args], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 2 and message in done.stderr and not done.stdout
