"""`python -m unit_mcp.agent` as a user runs it: a real subprocess against the real unit server and the
scripted model, both on loopback."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from unit_mcp.agent.cli import main
from unit_mcp.testing import Match, ScriptedModel, call, say, tool_call

from .conftest import UnitServer

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]


async def agent_cli(*args: str) -> tuple[int, str, str]:
    done = await anyio.run_process([sys.executable, "-m", "unit_mcp.agent", *args], cwd=REPO, check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_run_streams_the_turn_and_sessions_can_be_browsed(
    tmp_path: Path, unit_server: UnitServer, capsys: pytest.CaptureFixture[str]
) -> None:
    steps = [
        call(tool_call("unit_read_source", {"unit_id": "greeter", "source_id": "greeter.py"})),
        say("greeter.py is {{tool:unit_read_source.size}} bytes.", when=Match(last_role="tool"), chunk_size=3),
    ]
    data = str(tmp_path / "agent-data")
    async with ScriptedModel(steps) as model:
        code, out, err = await agent_cli(
            "--data-dir", data, "run", "--model", "m", "--base-url", model.base_url,
            "--mcp-url", unit_server.url, f"--mcp-token={unit_server.token}",
            "--allow", "filesystem-read", "how", "big", "is", "greeter?",
        )  # fmt: skip
        assert code == 0, err
        assert model.requests[0].messages[-1] == {"role": "user", "content": "how big is greeter?"}
    size = (unit_server.units_root / "greeter.py").stat().st_size
    assert out.strip() == f"greeter.py is {size} bytes."
    assert "→ unit_read_source" in err and "← unit_read_source" in err
    session_id = err.strip().splitlines()[-1].removeprefix("session: ")
    assert unit_server.called() == ["unit_read_source"]

    # browsing needs no servers: the same entry point, in process
    assert main(["--data-dir", data, "sessions", "list"]) == 0
    listing = capsys.readouterr().out
    assert listing.startswith(session_id) and "unit-agent" in listing
    assert main(["--data-dir", data, "sessions", "show", session_id]) == 0
    shown = capsys.readouterr().out
    assert "user: how big is greeter?" in shown and "→ unit_read_source" in shown
    assert main(["--data-dir", data, "sessions", "show", session_id, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == session_id
    assert main(["--data-dir", data, "sessions", "list", "--json"]) == 0
    assert [meta["id"] for meta in json.loads(capsys.readouterr().out)] == [session_id]


async def test_without_a_terminal_an_ask_is_denied_and_the_turn_goes_on(
    tmp_path: Path, unit_server: UnitServer, capsys: pytest.CaptureFixture[str]
) -> None:
    steps = [
        call(tool_call("unit_reload", {"unit_id": "counter"})),
        say("I may not reload.", when=Match(last_role="tool")),
    ]
    async with ScriptedModel(steps) as model:
        code, out, err = await agent_cli(
            "--data-dir", str(tmp_path / "d"), "run", "--model", "m", "--base-url", model.base_url,
            "--mcp-url", unit_server.url, f"--mcp-token={unit_server.token}", "reload", "counter",
        )  # fmt: skip
    assert code == 0 and out.strip() == "I may not reload."
    assert "✗ unit_reload: [approval_denied]" in err and unit_server.calls == []
    assert main(["--data-dir", str(tmp_path / "d"), "sessions", "show", "ses-0000000000000000"]) == 1
    assert "no session" in capsys.readouterr().err


async def test_an_approval_asked_on_a_closed_terminal_is_answered_later_and_the_turn_resumes(
    tmp_path: Path, unit_server: UnitServer, capsys: pytest.CaptureFixture[str]
) -> None:
    steps = [
        call(tool_call("unit_reload", {"unit_id": "counter"})),
        say("Reloaded: {{last}}", when=Match(last_role="tool")),
    ]
    data = str(tmp_path / "d")
    async with ScriptedModel(steps) as model:
        options = [
            "--model", "m", "--base-url", model.base_url, "--mcp-url", unit_server.url,
            f"--mcp-token={unit_server.token}",
        ]  # fmt: skip
        # The first life asks on a terminal (a pty) and is killed while the question waits for an answer.
        controller, terminal = pty.openpty()
        try:
            first = subprocess.Popen(
                [sys.executable, "-m", "unit_mcp.agent", "--data-dir", data, "run", *options,
                 "--session", "ses-cli", "reload", "counter"],
                cwd=REPO, stdin=terminal, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )  # fmt: skip
            assert first.stderr is not None
            asked = b""
            with anyio.fail_after(30):
                while b"? [y]es / [N]o" not in asked:
                    chunk = await anyio.to_thread.run_sync(first.stderr.read1)
                    assert chunk, f"the CLI ended before it asked: {asked.decode()}"
                    asked += chunk
            first.kill()
            first.wait(10)
        finally:
            os.close(controller)
            os.close(terminal)
        question = 'Allow unit_reload (shell) with {"unit_id": "counter"}?'
        assert question in asked.decode() and unit_server.calls == []

        assert main(["--data-dir", data, "sessions", "pending", "ses-cli"]) == 0
        (line,) = capsys.readouterr().out.strip().splitlines()
        request_id = line.split()[0]
        assert line == f'{request_id}  unit_reload (shell) with {{"unit_id": "counter"}}'

        code, out, err = await agent_cli("--data-dir", data, "answer", "ses-cli", "apr-nope", "approve", *options)
        assert code == 1 and f"no pending approval 'apr-nope' (pending: {request_id})" in err
        code, out, err = await agent_cli("--data-dir", data, "answer", "ses-cli", request_id, "approve", *options)
        assert code == 0, err
        assert out.strip().startswith("Reloaded: ") and "← unit_reload" in err
        assert "resumed after the approval" not in err  # the claim on the call before it ran is not shown
        assert unit_server.called() == ["unit_reload"]  # it ran once, after the answer

    assert main(["--data-dir", data, "sessions", "pending", "ses-cli"]) == 0
    assert capsys.readouterr().out == ""


def test_a_turn_needs_a_model_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    for command in (["run", "--model", "m", "hello"], ["answer", "ses-x", "apr-x", "approve", "--model", "m"]):
        assert main(["--data-dir", str(tmp_path), *command]) == 2
        assert "give --base-url or set OPENAI_BASE_URL" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing was created
