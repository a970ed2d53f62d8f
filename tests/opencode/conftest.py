"""Fixtures of the end-to-end suite against the real `opencode` binary (npm `opencode-ai`, pinned).

The binary is installed by scripts/opencode-tool into .cache/opencode (scripts/test runs it first; this
runs it too when the binary is missing). A binary that cannot be installed or run fails every test here
loudly: these tests never skip. Each test gets a fresh isolated root under its own `tmp_path`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from unit_mcp.agent.opencode import PINNED_VERSION, IsolatedRoot

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "scripts" / "opencode-tool"
CANDIDATES = (
    REPO / ".cache/opencode/node_modules/opencode-linux-x64/bin/opencode",
    REPO / ".cache/opencode/node_modules/.bin/opencode",
)


def _installed() -> Path | None:
    return next((path for path in CANDIDATES if path.is_file()), None)


@pytest.fixture(scope="session")
def opencode_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pinned binary, installed if missing; a failure here fails the test, never skips it."""
    if _installed() is None:
        done = subprocess.run([str(INSTALL)], capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0 or _installed() is None:
            pytest.fail(
                f"the OpenCode binary is not installed and {INSTALL.name} could not install it "
                f"(exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}",
                pytrace=False,
            )
    binary = _installed()
    assert binary is not None
    root = IsolatedRoot(tmp_path_factory.mktemp("opencode-version"))
    try:
        version = subprocess.run(
            [str(binary), "--version"], env=root.env(), cwd=root.workdir, capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"{binary} does not run: {exc}", pytrace=False)
    if version.stdout.strip() != PINNED_VERSION:
        pytest.fail(
            f"{binary} is OpenCode {version.stdout.strip()!r} (stderr: {version.stderr.strip()[-500:]!r}); "
            f"the suite pins {PINNED_VERSION}: rerun scripts/opencode-tool",
            pytrace=False,
        )
    return binary


@pytest.fixture
def isolated(tmp_path: Path) -> IsolatedRoot:
    """A fresh private world for one OpenCode process: HOME, XDG folders, TMPDIR, an empty working dir."""
    return IsolatedRoot(tmp_path / "opencode-root")
