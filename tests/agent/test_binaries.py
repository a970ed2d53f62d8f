"""Finding the provider binaries: the path given, else the environment variable, else PATH; a clear error
that says where it looked and how to install when none is executable."""

from __future__ import annotations

from pathlib import Path

import pytest

from unit_mcp.agent.codex import CodexNotInstalled, find_codex
from unit_mcp.agent.opencode import OpenCodeNotInstalled, find_opencode


def executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def test_the_given_path_wins_then_the_variable_then_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    given = executable(tmp_path / "given")
    from_env = executable(tmp_path / "from-env")
    (tmp_path / "bin").mkdir()
    on_path = executable(tmp_path / "bin" / "opencode")
    monkeypatch.setenv("OPENCODE_PATH", str(from_env))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert find_opencode(given) == given
    assert find_opencode() == from_env
    monkeypatch.delenv("OPENCODE_PATH")
    assert find_opencode() == on_path


def test_nothing_executable_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    not_executable = tmp_path / "codex"
    not_executable.write_text("not a program")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CODEX_PATH", raising=False)
    monkeypatch.delenv("OPENCODE_PATH", raising=False)
    with pytest.raises(CodexNotInstalled) as codex:
        find_codex(not_executable)
    message = str(codex.value)
    assert f"the path given ({not_executable})" in message and "$CODEX_PATH (unset)" in message
    assert "PATH (unset)" in message and "scripts/codex-tool" in message
    with pytest.raises(OpenCodeNotInstalled, match=r"\$OPENCODE_PATH \(unset\).*scripts/opencode-tool"):
        find_opencode()
