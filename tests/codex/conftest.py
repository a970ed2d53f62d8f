"""Fixtures of the Codex provider's suite, against the real Codex CLI (npm `@openai/codex`, pinned).

The binary is installed by scripts/codex-tool into .cache/codex (scripts/test runs it first; this runs it
too when the binary is missing). A binary that cannot be installed, run, or is another version fails
every test here loudly: these tests never skip. Each Codex run gets its own CODEX_HOME and HOME.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

from unit_mcp.agent.codex import PINNED_VERSION

REPO = Path(__file__).resolve().parents[2]
CODEX_INSTALL = REPO / "scripts" / "codex-tool"
CODEX_BINARY = REPO / ".cache/codex/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"
OPENCODE_INSTALL = REPO / "scripts" / "opencode-tool"
OPENCODE_BINARY = REPO / ".cache/opencode/node_modules/opencode-linux-x64/bin/opencode"


def _install(script: Path, binary: Path, what: str) -> Path:
    """The binary, installed by `script` if missing; a failure fails the test, never skips it."""
    if not binary.is_file():
        done = subprocess.run([str(script)], capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0 or not binary.is_file():
            pytest.fail(
                f"{what} is not installed and {script.name} could not install it "
                f"(exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}",
                pytrace=False,
            )
    return binary


@pytest.fixture(scope="session")
def codex_binary() -> Path:
    binary = _install(CODEX_INSTALL, CODEX_BINARY, "the Codex CLI")
    with tempfile.TemporaryDirectory(prefix="codex-version-") as home:
        try:
            version = subprocess.run(
                [str(binary), "--version"],
                env={"HOME": home, "CODEX_HOME": home, "PATH": "/usr/bin:/bin"},
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.fail(f"{binary} does not run: {exc}", pytrace=False)
    if version.stdout.strip() != f"codex-cli {PINNED_VERSION}":
        pytest.fail(
            f"{binary} is {version.stdout.strip()!r} (stderr: {version.stderr.strip()[-500:]!r}); "
            f"the suite pins codex-cli {PINNED_VERSION}: rerun scripts/codex-tool",
            pytrace=False,
        )
    return binary


@pytest.fixture(scope="session")
def opencode_binary() -> Path:
    """The pinned OpenCode binary, for the test that holds all three kinds of agent in one runner."""
    return _install(OPENCODE_INSTALL, OPENCODE_BINARY, "the OpenCode binary")
