"""`python -m unit_mcp.agent` as a user runs it: a real subprocess against the real unit server and the
scripted model, both on loopback."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import anyio
import pytest
from support.agent_cli import main

from unit_mcp.agent import SessionStore
from unit_mcp.testing import Match, ScriptedModel, call, say, tool_call

from .conftest import REPO, UnitServer, agent_cli, ask_on_a_terminal_then_die

pytestmark = pytest.mark.anyio


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
            "--mcp-url", unit_server.url, "--mcp-token-file", unit_server.token_file(tmp_path),
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
            "--mcp-url", unit_server.url, "--mcp-token-file", unit_server.token_file(tmp_path), "reload", "counter",
        )  # fmt: skip
    assert code == 0 and out.strip() == "I may not reload."
    assert "✗ unit_reload: [approval_denied]" in err and unit_server.called() == []
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
            "--mcp-token-file", unit_server.token_file(tmp_path),
        ]  # fmt: skip
        # The first life asks on a terminal (a pty) and is killed while the question waits for an answer.
        run = [*options, "--session", "ses-cli", "reload", "counter"]
        asked = await ask_on_a_terminal_then_die(data, run, wait=30)
        question = 'Allow unit_reload (shell) with {"unit_id": "counter"}?'
        assert question in asked and unit_server.called() == []

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


# -- what a person meets when something is off: one line saying what and what to do, never a traceback --


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def cli_with_env(env: dict[str, str], *args: str, cold: bool = False) -> tuple[int, str, str]:
    """The CLI with `env` over this process's environment less its MCP_, UNIT_MCP_ and OPENAI_ variables: a fork of
    the warm CLI, or with `cold` a fresh `python -m unit_mcp.agent` (the interpreter's own start, checked here)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_", "UNIT_MCP_", "OPENAI_"))}
    if not cold:
        return await agent_cli(*args, env={**clean, **env})
    done = await anyio.run_process(
        [sys.executable, "-m", "unit_mcp.agent", *args], cwd=REPO, check=False, env={**clean, **env}
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def last_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    return stderr.strip().splitlines()[-1]


async def test_a_refused_token_names_the_401_and_the_variable(tmp_path: Path, unit_server: UnitServer) -> None:
    """MCP_URL/MCP_TOKEN (what the server prints) are read, and UNIT_MCP_URL/UNIT_MCP_TOKEN as fallbacks."""
    expected = (
        f"unit-mcp agent: error: the unit server at {unit_server.url} refused the token (401 Unauthorized); "
        "pass the MCP_TOKEN it printed (MCP_TOKEN or --mcp-token-file)"
    )
    run = ["--data-dir", str(tmp_path / "d"), "run", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "hi"]
    for names in (("MCP_URL", "MCP_TOKEN"), ("UNIT_MCP_URL", "UNIT_MCP_TOKEN")):
        code, out, err = await cli_with_env({names[0]: unit_server.url, names[1]: "wrong"}, *run)
        assert code == 1 and out == "" and last_line(err) == expected and len(err.splitlines()) == 1, err
    assert unit_server.called() == []


async def test_an_unreachable_unit_server_is_one_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{unused_port()}/mcp"
    code, out, err = await cli_with_env(
        {"MCP_URL": url, "MCP_TOKEN": "t"},
        "--data-dir", str(tmp_path / "d"), "run", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "hi",
    )  # fmt: skip
    assert code == 1 and out == "" and len(err.splitlines()) == 1
    assert last_line(err).startswith(f"unit-mcp agent: error: cannot reach the unit server at {url} (")
    assert last_line(err).endswith("); start it (scripts/serve) and pass the MCP_URL it printed (--mcp-url or MCP_URL)")


async def test_a_model_endpoint_that_is_down_or_refuses_the_key_is_one_line(tmp_path: Path) -> None:
    base_url = f"http://127.0.0.1:{unused_port()}/v1"
    run = ["--data-dir", str(tmp_path / "d"), "run", "--model", "m", "hi"]
    code, _, err = await cli_with_env({"OPENAI_BASE_URL": base_url}, *run)
    assert code == 1
    assert last_line(err) == (
        f"unit-mcp agent: error: cannot reach the model endpoint {base_url} (Connection error.); check --base-url "
        "(or OPENAI_BASE_URL) and that the endpoint runs"
    )
    assert err.splitlines()[-2].startswith("session: ses-"), "the session (kept) is named before the error"

    refusal = say("unused", error={"status": 401, "message": "Incorrect API key provided"})
    async with ScriptedModel([refusal]) as model:
        base_url = model.base_url
        code, _, err = await cli_with_env({"OPENAI_API_KEY": "sk-wrong"}, *run, "--base-url", base_url)
    assert code == 1
    line = last_line(err)
    assert line.startswith(f"unit-mcp agent: error: the model endpoint {base_url} refused the API key (Error code: 401")
    assert "Incorrect API key provided" in line
    assert line.endswith("; pass a valid key (OPENAI_API_KEY or --api-key-file)")


async def test_a_store_that_cannot_be_written_and_an_unknown_session_are_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    store = blocker / "sessions"
    expected = (
        f"unit-mcp agent: error: cannot use the session store {store}: Not a directory; give a folder you can write "
        "(--data-dir or UNIT_MCP_AGENT_DATA)"
    )
    model = ["--model", "m", "--base-url", "http://127.0.0.1:9/v1"]
    for command in (["run", *model, "hi"], ["sessions", "pending", "ses-x"], ["sessions", "list"]):
        code, _, err = await cli_with_env({"UNIT_MCP_AGENT_DATA": str(store)}, *command)
        if command[-1] == "list":  # browsing opens the store read-only: a missing store is just empty
            assert code == 0 and err == "", err
            continue
        assert code == 1 and last_line(err) == expected and len(err.splitlines()) == 1, (command, err)

    data = tmp_path / "data"
    unknown = (
        f"unit-mcp agent: error: no session ses-nope in {data}; `unit-mcp agent sessions list` shows the sessions "
        "there (--sessions or --data-dir picks another store)"
    )
    for command in (["sessions", "show", "ses-nope"], ["sessions", "pending", "ses-nope"],
                    ["answer", "ses-nope", "apr-1", "approve", *model]):  # fmt: skip
        code, _, err = await cli_with_env({}, "--data-dir", str(data), *command)
        assert code == 1 and last_line(err) == unknown and len(err.splitlines()) == 1, (command, err)


async def test_help_shows_the_real_defaults(tmp_path: Path) -> None:
    code, out, _ = await cli_with_env(
        {"HOME": str(tmp_path), "XDG_DATA_HOME": "", "COLUMNS": "1000"}, "--help", cold=True
    )
    assert code == 0
    assert f"(default: $UNIT_MCP_AGENT_DATA or {tmp_path}/.local/share/unit-mcp/agent-sessions)" in " ".join(
        out.split()
    )
    code, out, _ = await cli_with_env({"COLUMNS": "1000"}, "run", "--help", cold=True)
    flat = " ".join(out.split())
    assert code == 0 and "(default: $MCP_URL;" in flat and "(yours, mode 0600; default: $MCP_TOKEN or" in flat
    assert "(default: $OPENAI_BASE_URL)" in flat


async def test_sessions_are_archived_and_deleted_from_the_cli_and_the_audit_says_so(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    store = SessionStore(data)
    old, spent, held = (store.create("unit-agent", title=title) for title in ("old work", "spent", "held"))
    store.close()
    held_open = SessionStore(data)
    held_open.load(held.id)  # another process's writer: as if a turn ran there now
    try:
        code, _, err = await agent_cli("--data-dir", data, "sessions", "delete", held.id)
        assert code == 1 and len(err.splitlines()) == 1, err
        assert last_line(err).startswith(f"unit-mcp agent: error: session {held.id} is open in another process")
    finally:
        held_open.close()

    code, _, err = await agent_cli("--data-dir", data, "sessions", "archive", old.id)
    assert code == 0 and err == f"archived session {old.id} (0 items)\n", err
    code, _, err = await agent_cli("--data-dir", data, "sessions", "delete", spent.id)
    assert code == 0 and err == f"deleted session {spent.id} (0 items)\n", err
    code, _, err = await agent_cli("--data-dir", data, "sessions", "delete", spent.id)
    assert code == 1 and last_line(err).startswith(f"unit-mcp agent: error: no session {spent.id} in {data}")

    code, out, _ = await agent_cli("--data-dir", data, "sessions", "list", "--json")
    assert code == 0 and [meta["id"] for meta in json.loads(out)] == [held.id]
    code, out, _ = await agent_cli("--data-dir", data, "sessions", "list", "--archived", "--json")
    assert code == 0 and [meta["id"] for meta in json.loads(out)] == [old.id]
    code, out, _ = await agent_cli("--data-dir", data, "sessions", "audit", "--json")
    audit = [(r["action"], r["via"], r["session"]["id"]) for r in json.loads(out)]
    assert code == 0 and audit == [("archive", "cli", old.id), ("delete", "cli", spent.id)]
    code, out, _ = await agent_cli("--data-dir", data, "sessions", "audit")
    assert code == 0 and out.splitlines()[1].endswith(f"delete  {spent.id}  via cli  spent"), out


async def test_run_takes_its_agents_from_a_file_and_runs_any_of_them_by_id(tmp_path: Path) -> None:
    steps = [say("looks fine", when=Match(user_contains="review"))]
    data = str(tmp_path / "agent-data")
    async with ScriptedModel(steps) as model:
        agents = tmp_path / "agents.toml"
        agents.write_text(
            "[[agent]]\nid = 'writer'\nprovider = 'openai'\nmodel = 'w'\n\n"
            f"[[agent]]\nid = 'reviewer'\nprovider = 'openai'\nmodel = 'r'\nbase_url = '{model.base_url}'\n"
            "api_key_env = 'REVIEWER_KEY'\nsystem_prompt = 'You review; you never edit.'\npresets = ['reading']\n",
            encoding="utf-8",
        )
        presets = tmp_path / "presets.toml"
        presets.write_text("[[preset]]\nname = 'reading'\ntools = ['unit_read_*']\n", encoding="utf-8")
        env = {"REVIEWER_KEY": "reviewer-key", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}  # writer: never asked
        code, out, err = await cli_with_env(
            env, "--data-dir", data, "run", "--agents", str(agents), "--presets", str(presets),
            "--agent", "reviewer", "review", "the", "counter",
        )  # fmt: skip
        assert code == 0, err
        (request,) = model.requests
    assert out.strip() == "looks fine"
    assert request.body["model"] == "r" and request.api_key == "reviewer-key"
    assert request.messages[0]["role"] == "system" and "You review; you never edit." in request.messages[0]["content"]
    session_id = err.strip().splitlines()[-1].removeprefix("session: ")
    session = SessionStore(data, read_only=True).require(session_id)
    assert session.agent_id == "reviewer"
    activated = [item.data for item in session.items if getattr(item, "kind", "") == "preset-activated"]
    assert [(event["name"], event["by"]) for event in activated] == [("reading", "user")]  # as the file says

    without_presets = ["--data-dir", data, "run", "--agents", str(agents), "--agent", "reviewer", "x"]
    code, _, err = await cli_with_env(env, *without_presets)
    assert code == 1 and last_line(err) == (
        "unit-mcp agent: error: agent reviewer names presets, but no preset file declares them (--presets) (--agents)"
    )

    code, _, err = await cli_with_env(
        env, "--data-dir", data, "run", "--agents", str(agents), "--presets", str(presets), "--agent", "x", "hi"
    )
    assert code == 1 and last_line(err) == (
        "unit-mcp agent: error: no agent 'x' (these are registered: reviewer, writer); pick one with --agent"
    )
    code, _, err = await cli_with_env({}, "--data-dir", data, "run", "--agents", str(agents), "hi")
    assert (
        code == 2 and last_line(err) == "unit-mcp agent: error: give --base-url or set OPENAI_BASE_URL"
    )  # writer names none
    agents.write_text("[[agent]]\nid = 'n'\nprovider = 'claude'\nmodel = 'm'\n", encoding="utf-8")
    code, _, err = await cli_with_env(env, "--data-dir", data, "run", "--agents", str(agents), "hi")
    assert code == 2 and "agents.toml: agent #1 is invalid: provider: Input should be" in last_line(err)
