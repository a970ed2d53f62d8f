"""The server, the agent runner and the fleet server hold the run's token, API keys and node passwords in memory
(and an API key or password may be in their environment): another process of the same user must not read them
through /proc or ptrace, and a crash must leave no core file. `proctree.keep_memory_private` makes the process
non-dumpable (PR_SET_DUMPABLE 0).

The tests run as root, whose CAP_SYS_PTRACE reads any process: the threat itself is shown with two processes of
uid 65534 (the system Python, stdlib only, as the attacker in test_idle_sockets), and the real servers and agent
runner are checked as root without CAP_SYS_PTRACE (dropped from the bounding set before exec), for which a
non-dumpable process's memory is closed as well."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from support.server_process import ServerProcess

from unit_mcp import proctree

from .clients import call, connect

pytestmark = pytest.mark.anyio
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
WAIT = 120
SLEEP = "import time\ntime.sleep(120)\n"

TARGET = r"""
import sys
namespace = {"__name__": "proctree"}
exec(sys.stdin.read(), namespace)  # unit_mcp/proctree.py: stdlib only, so it runs where uid 65534 can read nothing
if sys.argv[1] == "private":
    namespace["keep_memory_private"]()
print("ready", flush=True)
sys.stdout.close()
"""

READER = r"""
import sys
pid, secret = sys.argv[1], sys.argv[2].encode()
for name in ("environ", "mem"):
    try:
        with open(f"/proc/{pid}/{name}", "rb") as file:  # mem: opening is the check (reading needs an address)
            print(name, "holds the secret" if name == "environ" and secret in file.read() else "opened")
    except OSError as exc:
        print(name, type(exc).__name__)
"""

DROP_PTRACE = (
    "import ctypes, os, sys\n"
    "assert ctypes.CDLL(None, use_errno=True).prctl(24, 19, 0, 0, 0) == 0  # PR_CAPBSET_DROP, CAP_SYS_PTRACE\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)
"""Runs argv[1:] as root without CAP_SYS_PTRACE: it can no longer read a non-dumpable process's memory."""


def read_as_nobody(pid: int, secret: str) -> list[str]:
    done = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-c", READER, str(pid), secret],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize(("mode", "seen"), [("plain", ["environ holds the secret", "mem opened"]), ("private", None)])
def test_another_process_of_the_same_user_cannot_read_a_private_process(mode: str, seen: list[str] | None) -> None:
    secret = secrets.token_urlsafe(16)
    with subprocess.Popen(
        [SYSTEM_PYTHON, "-I", "-c", TARGET + SLEEP, mode],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        cwd="/",
        env={"UNIT_MCP_TEST_SECRET": secret},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as target:
        try:
            assert target.stdin is not None and target.stdout is not None
            target.stdin.write(Path(proctree.__file__).read_text())
            target.stdin.close()
            assert target.stdout.readline() == "ready\n", "the target did not start (its error is above)"
            # a plain process of uid 65534 is open to any other (the control: the reader sees it), a private one not
            assert read_as_nobody(target.pid, secret) == (seen or ["environ PermissionError", "mem PermissionError"])
        finally:
            target.kill()


def opens_memory(pid: int) -> bool:
    """Whether a root process without CAP_SYS_PTRACE can open /proc/PID/mem."""
    probe = f"import sys\ntry:\n    open('/proc/{pid}/mem', 'rb').close()\nexcept PermissionError:\n    sys.exit(3)\n"
    done = subprocess.run(
        [sys.executable, "-c", DROP_PTRACE, sys.executable, "-c", probe], capture_output=True, text=True, timeout=WAIT
    )
    assert done.returncode in (0, 3), done.stderr
    return done.returncode == 0


def without_ptrace(*argv: str) -> list[str]:
    return [sys.executable, "-c", DROP_PTRACE, sys.executable, *argv]


async def test_the_server_and_the_agent_runner_keep_their_memory_private_and_still_run_tests(tmp_path: Path) -> None:
    control = ServerProcess(tmp=tmp_path, program=without_ptrace("-c", "print('ready=1', flush=True)\n" + SLEEP))
    try:
        await anyio.to_thread.run_sync(lambda: control.ready(WAIT, last="ready"))
        assert opens_memory(control.proc.pid), "the control is open to the probe: it can see a dumpable process"
    finally:
        control.kill()

    server = ServerProcess(
        "--data-dir", str(tmp_path / "data"), tmp=tmp_path, program=without_ptrace("-m", "unit_mcp.server")
    )  # fmt: skip
    try:
        printed = await anyio.to_thread.run_sync(lambda: server.ready(WAIT))
        assert not opens_memory(server.proc.pid), "the server's memory is open to another process of its user"
        async with connect(printed["MCP_URL"], printed["MCP_TOKEN"]) as client:
            ran = await call(client, "unit_run_tests", {"unit_id": "counter", "test_name": "init"})
        # the warm test host (started by the server, forking each test) runs a unit's test as before
        assert not ran.is_error and ran.structured is not None and ran.structured["passed"] is True, ran

        ui = ServerProcess(
            "--data-dir", str(tmp_path / "agent"), "ui", "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
            "--mcp-url", printed["MCP_URL"], tmp=tmp_path, program=without_ptrace("-m", "unit_mcp.agent"),
            env={"MCP_TOKEN": printed["MCP_TOKEN"], "OPENAI_API_KEY": "sk-" + secrets.token_urlsafe(16)},
        )  # fmt: skip
        try:
            await anyio.to_thread.run_sync(lambda: ui.ready(WAIT, last="AGENT_UI_URL"))
            assert not opens_memory(ui.proc.pid), "the agent runner's memory is open to another process of its user"
        finally:
            assert ui.stop() == 0
    finally:
        assert server.stop() == 0


async def test_the_fleet_server_keeps_its_memory_private_and_still_answers(tmp_path: Path) -> None:
    password = secrets.token_urlsafe(16)
    fleet = ServerProcess(
        "--node", "a=http://127.0.0.1:9", tmp=tmp_path, program=without_ptrace("-m", "unit_mcp.fleet"),
        env={"FLEET_PASSWORD": password},
    )  # fmt: skip
    try:
        printed = await anyio.to_thread.run_sync(lambda: fleet.ready(WAIT))
        assert not opens_memory(fleet.proc.pid), "the fleet server's memory is open to another process of its user"
        async with connect(printed["MCP_URL"], printed["MCP_TOKEN"]) as client:
            listed = await call(client, "fleet_list_nodes", {})
        assert not listed.is_error and listed.structured is not None, listed
        assert [node["name"] for node in listed.structured["nodes"]] == ["a"]
    finally:
        assert fleet.stop() == 0
