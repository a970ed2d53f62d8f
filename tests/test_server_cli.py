"""`python -m unit_mcp.server` as a person meets it: real subprocesses. Every expected failure ends with one
line on stderr saying what happened and what to do, and a non-zero exit; a traceback only with --debug."""

from __future__ import annotations

import os
import shlex
import socket
import stat
import subprocess
import sys
from pathlib import Path

import httpx
from support.server_process import ServerProcess


def server_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unit_mcp.server", "--no-watch", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_port_in_use_is_one_line_and_debug_shows_the_traceback(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = server_cli(tmp_path, "--port", str(port))
        assert done.returncode == 1 and done.stdout == ""
        assert one_line(done.stderr) == (
            f"unit-mcp serve: error: cannot listen on 127.0.0.1:{port}: Address already in use; "
            "choose another --port, or leave --port out for a free one"
        )
        debug = server_cli(tmp_path, "--port", str(port), "--debug")
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "Address already in use" in debug.stderr


def test_a_data_dir_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    done = server_cli(tmp_path, "--data-dir", str(blocker / "data"))
    assert done.returncode == 1 and done.stdout == ""
    assert one_line(done.stderr) == (
        f"unit-mcp serve: error: cannot use --data-dir {blocker / 'data'}: Not a directory; "
        "give a folder you can write, or leave --data-dir out"
    )


def test_stdio_refuses_a_port_and_an_env_file(tmp_path: Path) -> None:
    for option in (["--port", "8000"], ["--env-file", str(tmp_path / "env")]):
        done = server_cli(tmp_path, "--stdio", *option)
        assert done.returncode == 2 and done.stdout == ""
        last = done.stderr.strip().splitlines()[-1]
        assert last.endswith(f"--stdio speaks on stdin/stdout and listens on no port; leave out {option[0]}"), last
    assert not (tmp_path / "env").exists()


def test_an_empty_units_folder_is_served_with_one_warning(tmp_path: Path) -> None:
    empty = tmp_path / "units"
    empty.mkdir()
    server = ServerProcess("--units", str(empty), "--no-watch", tmp=tmp_path)
    try:
        printed = server.ready()
        assert printed["MCP_URL"].endswith("/mcp")
    finally:
        assert server.stop() == 0
    warning, *ready = server.stderr().splitlines()  # then the line for a person, if it was out before the stop
    assert warning == (
        f"unit-mcp: warning: --units {empty} holds no units yet (add <unit_id>.py or <unit_id>/__init__.py)"
    )
    assert all(line.startswith(f"unit-mcp serve: serving 0 units from {empty} to MCP clients at ") for line in ready)
    assert len(ready) <= 1


def test_env_file_holds_the_printed_lines_for_a_shell(tmp_path: Path) -> None:
    env_file = tmp_path / "unit-mcp.env"
    env_file.write_text("OLD=1\n")
    env_file.chmod(0o644)
    before = env_file.stat().st_ino
    server = ServerProcess("--env-file", str(env_file), "--no-watch", tmp=tmp_path)
    try:
        printed = server.ready(last="UNITS_UI_URL")
        written = env_file.stat()
        assert stat.S_IMODE(written.st_mode) == 0o600, "the file holds the token"
        assert written.st_ino != before, "replaced by a rename, not rewritten in place"
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".unit-mcp.env")] == []
        shell = subprocess.run(
            ["bash", "-c", f'set -a; . "{env_file}"; env'], capture_output=True, text=True, check=True, env={}
        )
        sourced = dict(line.partition("=")[::2] for line in shell.stdout.splitlines())
        comments = [line[2:] for line in env_file.read_text().splitlines() if line.startswith("# ")]
    finally:
        assert server.stop() == 0
    command = printed.pop("XDG_CONFIG_HOME")  # a command line: a comment, sourcing must not run it
    assert comments == [f"XDG_CONFIG_HOME={command}"]
    assert {"MCP_URL", "MCP_TOKEN", "OPENCODE_CMD", "UNITS_UI_URL", "UNITS_UI_URL_FILE"} <= printed.keys()
    assert {key: sourced.get(key) for key in printed} == printed, "every printed KEY=VALUE line is in the env file"
    assert "OLD" not in sourced and "XDG_CONFIG_HOME" not in sourced


def test_a_spent_login_link_leads_to_a_fresh_one_in_a_private_file(tmp_path: Path) -> None:
    env_file = tmp_path / "unit-mcp.env"
    server = ServerProcess("--env-file", str(env_file), "--no-watch", tmp=tmp_path)
    try:
        printed = server.ready(last="UNITS_UI_URL")
        link, link_file = printed["UNITS_UI_URL"], Path(printed["UNITS_UI_URL_FILE"])
        assert stat.S_IMODE(link_file.stat().st_mode) == 0o600 and link_file.read_text() == f"{link}\n"
        with httpx.Client(timeout=30) as http:
            assert http.get(link).status_code == 200  # a script (or a person) logs in: the link is spent
            announced = server.ready(last="UNITS_UI_URL")["UNITS_UI_URL"]
            gone = http.get(link)
            assert gone.status_code == 410 and "works once" in gone.text and "UNITS_UI_URL_FILE" in gone.text
            fresh = link_file.read_text().strip()
            assert fresh == announced != link
            assert f"UNITS_UI_URL={shlex.quote(fresh)}" in env_file.read_text().splitlines()
            assert http.get(fresh).status_code == 200, "the fresh link from the file works"
            assert http.get(fresh).status_code == 410
            assert link_file.read_text().strip() not in (link, fresh)
    finally:
        assert server.stop() == 0


def test_an_env_file_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    target = tmp_path / "missing-folder" / "unit-mcp.env"
    done = server_cli(tmp_path, "--env-file", str(target))
    assert done.returncode == 1
    assert one_line(done.stderr) == (
        f"unit-mcp serve: error: cannot use --env-file {target}: No such file or directory; "
        "give a file in a folder you can write"
    )


def test_max_call_s_must_be_seconds_above_zero(tmp_path: Path) -> None:
    for value in ("0", "-5", "soon", "inf"):
        done = server_cli(tmp_path, "--max-call-s", value)
        assert done.returncode == 2 and done.stdout == ""
        last = done.stderr.strip().splitlines()[-1]
        assert last.endswith(f"{value!r} is not a number of seconds above 0, e.g. 240"), last
