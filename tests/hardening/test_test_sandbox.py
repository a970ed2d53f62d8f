"""A unit test cannot escape its run: helpers it detaches are killed, a warm host it stops cannot stretch the
timeout, and it sees neither the server's folder nor its secrets.

Each attack is a test module of a hostile unit, run with `unit_run_tests` over loopback HTTP (the warm test host)
and, for the escapes, on the cold path too (a new interpreter per test, used when the warm host cannot start).
"""

from __future__ import annotations

import json
import re
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import copy_units

from unit_mcp.proctree import stopped
from unit_mcp.testrun import LIBPQ_ENV, PASSED_ENV, SCRATCH_ENV, WARM, run_test_process

from .clients import call, connect, visible
from .conftest import Served
from .report import Report

pytestmark = pytest.mark.anyio

MARK = f"unit-sandbox-{secrets.token_hex(6)}"
"""On the command line of every helper the hostile tests start: how the attacks find what survived."""

HELPER = f'''"""Starts a helper as a daemon starts: in a session of its own, two forks away, its parent gone at once."""

import os
import sys

SLEEP = "import time; time.sleep(600)"
HOP = "import os, time\\nwhile True:\\n    if os.fork():\\n        os._exit(0)\\n    time.sleep(0.005)\\n"


def double_fork(hop=False):
    read, write = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(write, f"{{os.getpid()}}\\n".encode())
            os.execv(sys.executable, [sys.executable, "-c", HOP if hop else SLEEP, {MARK!r}])
        os._exit(0)
    print(f"helper {{int(os.read(read, 64))}}", flush=True)
'''

IMPORT = "from .helper import double_fork\n"
ESCAPES = {
    "returns": f"{IMPORT}\n\ndef main():\n    double_fork()\n",
    "exits": f"import os\n\n{IMPORT}\n\ndef main():\n    double_fork()\n    os._exit(0)  # the test host dies first\n",
    "unreaps": f"import ctypes\n\n{IMPORT}\n\ndef main():\n"
    "    ctypes.CDLL(None).prctl(36, 0, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER off\n    double_fork()\n",
    "hops": f"{IMPORT}\n\ndef main():\n    double_fork(hop=True)  # a new pid every 5 ms\n",
    "hangs": f"import time\n\n{IMPORT}\n\ndef main():\n    double_fork()\n    time.sleep(600)\n",
}

STOP = "import os\nimport signal\nimport time\n\n\ndef main():\n    print('stopped', os.getppid(), flush=True)\n"
STOPS = {  # SIGSTOP to the parent: the warm host
    "stop_returns": f"{STOP}    os.kill(os.getppid(), signal.SIGSTOP)\n",
    "stop_hangs": f"{STOP}    os.kill(os.getppid(), signal.SIGSTOP)\n    time.sleep(600)\n",
}

SNOOP = """import json
import os
import tempfile
from pathlib import Path


def main():
    cwd = Path.cwd()
    client = cwd / "clients" / "claude-mcp.json"
    print("SNOOP " + json.dumps({
        "cwd": str(cwd),
        "name": cwd.name,
        "mode": cwd.stat().st_mode & 0o777,
        "files": {str(p): p.read_text(errors="replace") for p in cwd.rglob("*") if p.is_file()},
        "client": client.read_text() if client.exists() else None,
        "tmp": tempfile.gettempdir(),
        "env": dict(os.environ),
    }))
"""


@pytest.fixture
def units_root(tmp_path: Path) -> Path:
    root = copy_units(tmp_path / "units")
    unit = root / "sandbox"
    unit.mkdir()
    (unit / "__init__.py").write_text('"""Hostile tests."""\n')
    (unit / "helper.py").write_text(HELPER)
    for name, source in {**ESCAPES, **STOPS}.items():
        (unit / f"test_{name}.py").write_text(source)
    (unit / "test_snoop.py").write_text(SNOOP)
    return root


def marked() -> list[int]:
    """Running processes started by the hostile tests (zombies, dead already, do not count)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if MARK.encode() in (entry / "cmdline").read_bytes():
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


async def run_tests(served: Served, test_name: str, timeout: float) -> tuple[str, Any]:
    async with connect(served.url, served.token) as client:
        result = await call(
            client, "unit_run_tests", {"unit_id": "sandbox", "test_name": test_name, "timeout": timeout}
        )
    return visible(result), result


async def snoop(served: Served) -> tuple[str, dict[str, Any]]:
    """What the snooping test saw, and all the client saw of its run."""
    text, result = await run_tests(served, "snoop", timeout=30)
    assert not result.is_error and result.structured["passed"], text[-500:]
    return text, json.loads(result.structured["stdout"].split("SNOOP ", 1)[1])


@pytest.mark.parametrize("path", ["warm", "cold"])
@pytest.mark.parametrize("escape", list(ESCAPES))
async def test_double_forked_setsid_helper_is_killed(served: Served, figures: Report, escape: str, path: str) -> None:
    if path == "warm":
        text, _ = await run_tests(served, escape, timeout=4)
    else:
        host = served.host
        run = await anyio.to_thread.run_sync(
            lambda: run_test_process(host.loader.address, host.namespace, "sandbox", escape, timeout=4, warm=False)
        )
        text = run.stdout + run.stderr
    answered = marked()
    helper = re.search(r"helper (\d+)", text)
    assert helper, f"the helper was started and reported its pid: {text[-500:]}"
    deadline = time.monotonic() + 10  # a SIGKILLed process is gone at once; the bound only absorbs a slow machine
    while marked() and time.monotonic() < deadline:
        await anyio.sleep(0.05)
    assert not marked(), f"helpers still running after the run: {marked()}"
    figures.record("test_sandbox", **{f"helper_{escape}_{path}": {"left_running_at_answer": len(answered)}})


@pytest.mark.parametrize("attack", list(STOPS))
async def test_stopped_warm_host_cannot_stretch_the_timeout(served: Served, figures: Report, attack: str) -> None:
    started = time.monotonic()
    with anyio.fail_after(120):  # before the fix the call waited for the stopped host; this ends such a hang
        text, result = await run_tests(served, attack, timeout=5)
    answered_after = time.monotonic() - started
    stopped_host = re.search(r"stopped (\d+)", text)
    assert stopped_host, f"the test stopped its warm host: {text[-500:]}"
    pid = int(stopped_host.group(1))
    assert answered_after < 20, f"timeout=5 answered after {answered_after:.1f} s"
    assert result.is_error or not result.structured["passed"], "a run whose host stopped does not pass"
    assert "the warm test host did not report how this test ended" in text, "and says why"
    assert WARM.pid != pid and not Path(f"/proc/{pid}").exists(), "the stopped warm host was killed and reaped"
    assert not stopped(pid)

    started = time.monotonic()
    async with connect(served.url, served.token) as client:
        with anyio.fail_after(120):
            after = await call(client, "unit_run_tests", {"unit_id": "counter", "timeout": 30})
    next_run = time.monotonic() - started
    assert not after.is_error and after.structured and after.structured["passed"], visible(after)
    assert WARM.pid not in (None, pid), "the next run went through a new warm host"
    figures.record(
        "test_sandbox",
        **{attack: {"timeout_s": 5, "answered_after_s": round(answered_after, 2), "next_run_s": round(next_run, 2)}},
    )


async def test_tests_run_in_a_scratch_folder_without_secrets(
    served: Served, figures: Report, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets_in_env = {name: f"secret-{name}-{secrets.token_hex(8)}" for name in ("OPENAI_API_KEY", "MCP_TOKEN")}
    for name, value in secrets_in_env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("UNIT_SANDBOX_OPT_IN", "opted-in")
    client_token = f"token-{secrets.token_hex(8)}"
    clients = served.host.data_dir / "clients"
    clients.mkdir(exist_ok=True)
    (clients / "claude-mcp.json").write_text(json.dumps({"headers": {"Authorization": f"Bearer {client_token}"}}))

    text, seen = await snoop(served)
    forbidden = [*secrets_in_env.values(), client_token]
    assert [secret for secret in forbidden if secret in text] == [], "no secret of the server reaches a test"
    # libpq's variables pass only to a PostgreSQL store's tests (they reach their database); these units are a folder
    set_by_us = {"PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PYTHONUSERBASE", *SCRATCH_ENV}
    assert LIBPQ_ENV.isdisjoint(seen["env"]), "no database password reaches a folder's tests"
    unexpected = [name for name in seen["env"] if name not in PASSED_ENV | set_by_us and not name.startswith("LC_")]
    assert unexpected == [], "only the allowed list of variables"
    assert seen["cwd"] != "<data>" and seen["client"] is None
    assert seen["name"].startswith("unit-mcp-test-") and seen["files"] == {}, "a fresh folder of its own"
    assert seen["mode"] == 0o700, "private"
    assert seen["env"]["HOME"] == seen["env"]["TMPDIR"] == seen["tmp"] == seen["cwd"]
    assert not (Path(tempfile.gettempdir()) / seen["name"]).exists(), "removed after the run"

    WARM.start(pass_env=["UNIT_SANDBOX_OPT_IN"])  # what `--test-env UNIT_SANDBOX_OPT_IN` does
    try:
        _, opted = await snoop(served)
    finally:
        WARM.start()
    assert opted["env"]["UNIT_SANDBOX_OPT_IN"] == "opted-in", "a variable the operator names is passed"
    assert "UNIT_SANDBOX_OPT_IN" not in text, "and only then"
    figures.record("test_sandbox", scratch={"variables_seen": sorted(seen["env"]), "secrets_seen": 0})
