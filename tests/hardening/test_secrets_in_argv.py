"""No secret on a command line: every local user reads argv through /proc/PID/cmdline, so the token, API keys and
node passwords reach each process through the environment or a 0600 file. The printed and documented command
lines carry none; the argv of the server, its warm and test hosts, the agent CLI and the fleet carry none; a
secret given as a flag, in a node URL or in a file others can read is refused in one line."""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
import sys
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from opencode.conftest import opencode_binary  # noqa: F401 (the pinned binary, a fixture)
from support.server_process import ServerProcess

from unit_mcp.agent.opencode import NodeProcess

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]
WAIT = 120


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except (FileNotFoundError, ProcessLookupError):
        return []


def descendants(pid: int) -> list[int]:
    """Every process below `pid` now, however it detached from its session (found by parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def assert_no_secret_in_argv(pids: list[int], named: dict[str, str]) -> list[list[str]]:
    """Read each process's argv as another user would; returns them (to show what was checked)."""
    seen = []
    for pid in pids:
        argv = cmdline(pid)
        joined = "\0".join(argv)
        for name, value in named.items():
            assert value not in joined, f"the {name} is in the argv of pid {pid} ({argv[:3]}…)"
        seen.append(argv)
    return seen


def no_secret_in_lines(lines: list[str], token: str) -> None:
    """Every printed line but `MCP_TOKEN=` itself (a value for the environment, on stdout) is free of the token,
    and so is every word of every command line among them."""
    for line in lines:
        key, _, value = line.partition("=")
        if key == "MCP_TOKEN":
            assert value == token
            continue
        assert token not in line, f"{key} carries the token"
        if key.endswith("_CMD") or line.startswith("XDG_CONFIG_HOME="):
            assert all(token not in word for word in shlex.split(value)), key


async def test_no_secret_in_printed_lines_or_docs(tmp_path: Path) -> None:
    server = ServerProcess(
        "--data-dir", str(tmp_path / "data"), "--env-file", str(tmp_path / "env"), tmp=tmp_path, cold=True
    )
    try:
        printed = server.ready()
    finally:
        assert server.stop() == 0
    token = printed["MCP_TOKEN"]
    assert len(token) >= 32
    lines = [f"{key}={value}" for key, value in printed.items()]
    lines += server.stderr().splitlines()
    no_secret_in_lines(lines, token)
    assert {"CLAUDE_CMD", "INSPECTOR_CMD", "OPENCODE_CMD"} <= printed.keys()
    assert token not in Path(printed["OPENCODE_CMD"]).read_text(), "the launcher would put it on opencode's argv"
    inspector = shlex.split(printed["INSPECTOR_CMD"])
    config = json.loads(Path(inspector[inspector.index("--config") + 1]).read_text())
    assert token in json.dumps(config), "the Inspector's token is in its 0600 config file instead"

    password = secrets.token_urlsafe(16)
    fleet = ServerProcess(
        "--node",
        "a=http://opencode@127.0.0.1:9",
        tmp=tmp_path,
        module="unit_mcp.fleet",
        cold=True,
        env={"FLEET_PASSWORD": password},
    )
    try:
        fleet_printed = fleet.ready()
    finally:
        assert fleet.stop() == 0
    fleet_lines = [f"{key}={value}" for key, value in fleet_printed.items()] + fleet.stderr().splitlines()
    assert all(password not in line for line in fleet_lines)
    no_secret_in_lines(fleet_lines, fleet_printed["MCP_TOKEN"])

    docs = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    blocks = [block for doc in docs for block in re.findall(r"```[^\n]*\n(.*?)```", doc.read_text(), re.S)]
    assert len(blocks) > 20, "the README's code blocks were not found"
    hazards = {
        "a secret flag": re.compile(r"--(mcp-token|api-key|password)(=|\s)"),
        "a password in a URL": re.compile(r"://[^/\s:@]+:[^/\s@]+@"),
        "a literal bearer token": re.compile(r"Bearer [A-Za-z0-9_\-]{12,}"),
        "a header on a command line": re.compile(r"--header\b"),
    }
    for block in blocks:
        for what, pattern in hazards.items():
            assert not pattern.search(block), f"a documented command carries {what}: {pattern.search(block)}"


@pytest.mark.parametrize(
    ("module", "args", "remedy"),
    [
        (
            "unit_mcp.agent",
            ["run", "--model", "m", "--mcp-token", "SECRET", "hi"],
            "set MCP_TOKEN or give --mcp-token-file",
        ),
        (
            "unit_mcp.agent",
            ["run", "--model", "m", "--mcp-token=SECRET", "hi"],
            "set MCP_TOKEN or give --mcp-token-file",
        ),
        ("unit_mcp.agent", ["ui", "--model", "m", "--api-key", "SECRET"], "set OPENAI_API_KEY or give --api-key-file"),
        (
            "unit_mcp.fleet",
            ["--node", "a=http://h:1", "--password", "SECRET"],
            "set FLEET_PASSWORD or give --password-file",
        ),
        ("unit_mcp.fleet", ["--node", "build=http://me:SECRET@h:1"], "drop it and set FLEET_PASSWORD_BUILD"),
    ],
)
def test_a_secret_given_on_the_command_line_is_refused(module: str, args: list[str], remedy: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2 and done.stdout == ""
    line = done.stderr.strip().splitlines()[-1]
    assert remedy in line and "every local user" in line, done.stderr
    assert "SECRET" not in line, "the refusal repeats the secret"
    assert "Traceback" not in done.stderr


def test_a_secret_file_other_users_can_read_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    token.chmod(0o644)
    done = subprocess.run(
        [sys.executable, "-m", "unit_mcp.agent", "--data-dir", str(tmp_path / "d"), "run", "--model", "m",
         "--base-url", "http://127.0.0.1:9/v1", "--mcp-token-file", str(token), "hi"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.strip() == (
        f"unit-mcp agent: error: --mcp-token-file {token} can be read or changed by other users "
        f"(uid {os.geteuid()}, mode 0644); "
        f"make it yours with `chmod 600 {token}`"
    )
    assert not (tmp_path / "d").exists(), "nothing ran"


WAITING_TEST = """\
import pathlib
import time


def main():
    pathlib.Path({started!r}).touch()
    deadline = time.monotonic() + {wait}
    while not pathlib.Path({release!r}).exists():
        assert time.monotonic() < deadline, "never released"
        time.sleep(0.05)
    return True
"""


async def test_no_secret_in_the_argv_of_any_process_the_server_the_agent_or_the_fleet_start(tmp_path: Path) -> None:
    started, release = tmp_path / "test-started", tmp_path / "test-release"
    unit = tmp_path / "units" / "waiter"
    unit.mkdir(parents=True)
    (unit / "__init__.py").write_text("")
    (unit / "test_init.py").write_text(WAITING_TEST.format(started=str(started), release=str(release), wait=WAIT))
    server = ServerProcess(
        "--units", str(tmp_path / "units"), "--data-dir", str(tmp_path / "data"), tmp=tmp_path, cold=True
    )
    try:
        printed = await anyio.to_thread.run_sync(server.ready)
        token = printed["MCP_TOKEN"]
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http,
            Client(streamable_http_client(printed["MCP_URL"], http_client=http)) as client,
            anyio.create_task_group() as tg,
        ):
            results = []

            async def run_tests() -> None:
                results.append(await client.call_tool("unit_run_tests", {"unit_id": "waiter"}))

            tg.start_soon(run_tests)
            with anyio.fail_after(WAIT):
                while not started.exists():
                    await anyio.sleep(0.05)
            # The unit's test is running now: the server, its warm test host and the test's process all exist.
            below = descendants(server.proc.pid)
            seen = assert_no_secret_in_argv([server.proc.pid, *below], {"MCP token": token})
            assert any("unit_mcp.warmhost" in argv or "unit_mcp.testhost" in argv for argv in seen[1:]), seen
            assert len(below) >= 2, f"only {seen[1:]} below the server while a unit test ran"
            release.touch()
        (result,) = results
        assert not result.is_error and result.structured_content is not None
        assert result.structured_content["passed"] is True, result.structured_content

        api_key = "sk-" + secrets.token_urlsafe(24)
        ui = ServerProcess(
            "--data-dir", str(tmp_path / "agent"), "ui", "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
            "--mcp-url", printed["MCP_URL"], tmp=tmp_path, module="unit_mcp.agent",
            env={"MCP_TOKEN": token, "OPENAI_API_KEY": api_key}, cold=True,
        )  # fmt: skip
        try:
            await anyio.to_thread.run_sync(lambda: ui.ready(60, last="AGENT_UI_URL"))
            pids = [ui.proc.pid, *descendants(ui.proc.pid)]
            assert_no_secret_in_argv(pids, {"MCP token": token, "API key": api_key})
        finally:
            assert ui.stop() == 0
    finally:
        assert server.stop() == 0

    password = secrets.token_urlsafe(16)
    fleet = ServerProcess(
        "--node", "a=http://opencode@127.0.0.1:9", tmp=tmp_path, module="unit_mcp.fleet",
        env={"FLEET_PASSWORD_A": password}, cold=True,
    )  # fmt: skip
    try:
        fleet_printed = await anyio.to_thread.run_sync(fleet.ready)
        pids = [fleet.proc.pid, *descendants(fleet.proc.pid)]
        assert_no_secret_in_argv(pids, {"node password": password, "fleet token": fleet_printed["MCP_TOKEN"]})
    finally:
        assert fleet.stop() == 0


async def test_an_opencode_node_gets_its_password_by_environment(opencode_binary: Path) -> None:  # noqa: F811
    """The runner's and the fleet's `opencode serve` nodes: the basic-auth password is in their environment."""
    async with NodeProcess(binary=opencode_binary) as node:
        assert node.pid is not None and node.password
        async with node.client() as client:
            assert await client.list_sessions() == []  # the password works
        seen = assert_no_secret_in_argv([node.pid, *descendants(node.pid)], {"node password": node.password})
        assert any("serve" in argv for argv in seen), seen
