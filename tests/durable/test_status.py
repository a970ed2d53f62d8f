"""Who is doing what (`unit-mcp agent status`, the page's "Working now"), with real processes sharing one store: a
durable worker whose turn waits for a person, an `agent run` in a tool call and another in a model request. Each
is listed by agent and worker with its step and for how long; the worker with its last beat."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from agent.conftest import REPO, UnitServer, agent_cli
from ui.conftest import page_client, serving

from unit_mcp.agent import AgentApprovals, AgentRegistry, AgentRunner, AgentToolSurface, DurableClient, SessionStore
from unit_mcp.testing import Match, ScriptedModel, call, say, tool_call

from .workers import Workers

pytestmark = pytest.mark.anyio
HOST = socket.gethostname()
EXPECTED = {  # session: (step, tool)
    "ses-wipe": ("waiting for a person", "wipe_units"),
    "ses-sleep": ("tool call", "slow_echo"),
    "ses-think": ("model request", None),
}


async def status(data: Path, system_db: str) -> dict:
    code, out, err = await agent_cli("--data-dir", str(data), "status", "--json", "--system-db", system_db)
    assert code == 0, err
    return json.loads(out)


async def test_status_lists_running_turns_by_agent_and_worker_with_their_step_in_the_cli_and_on_the_page(
    tmp_path: Path, unit_server: UnitServer
) -> None:
    data, system = tmp_path / "data", tmp_path / "system"
    data.mkdir(mode=0o700)
    system.mkdir(mode=0o700)
    system_db = f"sqlite:///{system / 'dbos.sqlite'}"
    script = [
        call(tool_call("wipe_units", {}), when=Match(user_contains="wipe"), label="the durable turn asks"),
        call(tool_call("slow_echo", {"seconds": 120}), when=Match(user_contains="sleep"), label="in a tool"),
        say("thought", when=Match(user_contains="think"), delay=120, label="in the model"),
    ]
    async with ScriptedModel(script) as model:
        model_options = ["--model", "scripted", "--base-url", model.base_url]
        tools = ["--mcp-url", unit_server.url, "--mcp-token-file", unit_server.token_file(tmp_path)]
        workers = Workers(data, [*model_options, "--system-db", system_db, *tools])
        runs: dict[str, subprocess.Popen[bytes]] = {}
        store = SessionStore(data)
        try:
            assert (await status(data, system_db)) | {"at": 0} == {"at": 0, "turns": [], "workers": []}
            await workers.start("worker-a")
            store.create("unit-agent", session_id="ses-wipe")
            async with DurableClient(system_db) as client:
                await client.submit(store, "ses-wipe", "wipe the units")
            for session_id, words in (("ses-sleep", ["sleep", "a", "while"]), ("ses-think", ["think", "hard"])):
                runs[session_id] = subprocess.Popen(
                    [sys.executable, "-m", "unit_mcp.agent", "--data-dir", str(data), "run", *model_options, *tools,
                     "--session", session_id, *words],
                    cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
            looked: dict[str, tuple[str, str | None, float]] = {}
            with anyio.fail_after(120):
                while True:  # each turn in its step, the same since as a look a second ago (its checkpoint taken)
                    seen = await status(data, system_db)
                    steps = {turn["session_id"]: (turn["step"], turn["tool"]) for turn in seen["turns"]}
                    now = {turn["session_id"]: (turn["step"], turn["tool"], turn["since"]) for turn in seen["turns"]}
                    if steps == EXPECTED and now == looked:
                        break
                    looked = now
                    for session_id, run in runs.items():
                        assert run.poll() is None, f"agent run of {session_id} ended: {run.returncode}"
                    await anyio.sleep(1)
            turns = {turn["session_id"]: turn for turn in seen["turns"]}
            assert turns["ses-wipe"]["worker"] == "worker-a" and turns["ses-wipe"]["durable"] is True
            for session_id in ("ses-sleep", "ses-think"):
                assert turns[session_id]["worker"] == f"pid {runs[session_id].pid} on {HOST}"
                assert turns[session_id]["durable"] is False
            assert {turn["agent_id"] for turn in turns.values()} == {"unit-agent"}
            for turn in turns.values():
                assert turn["started_at"] <= turn["since"] <= seen["at"]
            (worker,) = seen["workers"]
            assert (worker["executor_id"], worker["pid"], worker["alive"]) == (
                "worker-a",
                workers.running["worker-a"].pid,
                True,
            )
            assert seen["at"] - worker["beat"] < 30

            with anyio.fail_after(30):  # the same steps, each longer, once the worker has beaten again
                while (again := await status(data, system_db))["workers"][0]["beat"] <= worker["beat"]:
                    await anyio.sleep(0.1)  # it beats every BEAT_SECONDS: a look at once may see the same beat
            later = {turn["session_id"]: turn for turn in again["turns"]}
            assert {sid: turn["since"] for sid, turn in later.items()} == {
                sid: turn["since"] for sid, turn in turns.items()
            }
            assert again["at"] > seen["at"] and again["workers"][0]["beat"] > worker["beat"]

            code, out, err = await agent_cli("--data-dir", str(data), "status", "--system-db", system_db)
            assert code == 0, err
            lines = out.splitlines()
            assert "agent unit-agent on worker-a:" in lines
            assert any(line.startswith("  session ses-wipe turn turn-") and ": waiting for a person wipe_units for "
                       in line for line in lines), out  # fmt: skip
            assert f"agent unit-agent on pid {runs['ses-sleep'].pid} on {HOST}:" in lines
            assert any(": tool call slow_echo for " in line for line in lines), out
            assert any(": model request for " in line for line in lines), out
            assert any(line.startswith("worker worker-a: pid ") and ", alive, last beat " in line for line in lines)

            runner = AgentRunner(
                store=SessionStore(data), registry=AgentRegistry(), tools=AgentToolSurface(AgentApprovals())
            )
            async with (
                runner,
                serving(runner, system_db=system_db) as (ui, base),
                page_client(ui.login_url(base)) as page,
            ):
                shown = await page.get("/status")
                assert shown.status_code == 200, shown.text
                for session_id, (step, tool) in EXPECTED.items():
                    assert f'data-session="{session_id}"' in shown.text
                    assert f">{step}</span>" in shown.text and (tool is None or f">{tool}</span>" in shown.text)
                assert ">worker-a <span" in shown.text and 'data-worker="worker-a"' in shown.text
                assert f"pid {runs['ses-think'].pid} on {HOST}" in shown.text
                fragment = await page.get("/fragments/status")
                assert fragment.status_code == 200 and 'data-session="ses-sleep"' in fragment.text
                first = await anyio.to_thread.run_sync(ui.status_state)
                await anyio.sleep(1.2)
                assert await anyio.to_thread.run_sync(ui.status_state) != first, "the durations count: live"
        finally:
            for run in runs.values():
                run.kill()
                run.wait(30)
            workers.close()
            store.close()
