"""What `_durable` relies on of DBOS: the private `DBOS._recover_pending_workflows([executor_id])` makes a live
process resume the workflows another executor left pending when it was SIGKILLed (DBOS 3 dropped the admin server
that offered this), completed steps are not run again, and a message sent meanwhile is received; and the SQLite
system database engine it builds itself (`sqlite_engine`) sets what DBOS's own would.
"""

from __future__ import annotations

import inspect
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import sqlalchemy as sa
from dbos import DBOS, DBOSClient
from dbos._sys_db_sqlite import SQLiteSystemDatabase
from support.dbos_contract import recover, sqlite_engine

from unit_mcp.agent import DurableClient

pytestmark = pytest.mark.anyio

TESTS = Path(__file__).resolve().parents[1]  # the process below imports `support` from here, as this file does

PROCESS = r"""
import sys
from pathlib import Path

from dbos import DBOS, SetWorkflowID

root, executor, dead = Path(sys.argv[1]), sys.argv[2], sys.argv[3]


@DBOS.step()
def first() -> None:
    with (root / "first-ran").open("a") as out:
        out.write(executor + "\n")


@DBOS.workflow(name="contract")
def contract() -> str:
    first()
    print("waiting", flush=True)
    return f"got {DBOS.recv('go', timeout_seconds=600)}"


DBOS(config={"name": "contract", "system_database_url": f"sqlite:///{root / 'dbos.sqlite'}", "executor_id": executor})
DBOS.launch()
if dead == "-":
    with SetWorkflowID("wf-1"):
        DBOS.start_workflow(contract)
else:
    from support.dbos_contract import recover  # tests/ on PYTHONPATH

    recover(dead)
    print("recovered", flush=True)
print("result", DBOS.retrieve_workflow("wf-1").get_result(), flush=True)
"""


def test_the_private_call_keeps_its_shape() -> None:
    assert list(inspect.signature(DBOS._recover_pending_workflows).parameters) == ["executor_ids"]
    assert "DBOS._recover_pending_workflows([executor_id])" in inspect.getsource(recover)


async def test_a_live_process_resumes_the_workflow_a_killed_executor_left_pending(tmp_path: Path) -> None:
    script = tmp_path / "process.py"
    script.write_text(PROCESS, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    gone = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), "gone", "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert gone.stdout is not None
    with anyio.fail_after(60):
        while b"waiting" not in await anyio.to_thread.run_sync(gone.stdout.readline):
            assert gone.poll() is None
    gone.send_signal(signal.SIGKILL)
    assert gone.wait(30) == -signal.SIGKILL

    async with DurableClient(f"sqlite:///{tmp_path / 'dbos.sqlite'}") as client:
        await client.client.send_async("wf-1", "yes", "go")  # while no process runs the workflow
    with anyio.fail_after(120):
        live = await anyio.run_process(
            [sys.executable, str(script), str(tmp_path), "live", "gone"], check=False, env=env
        )
    assert live.returncode == 0, live.stderr.decode()[-2000:]
    assert "result got yes" in live.stdout.decode().splitlines()
    assert (tmp_path / "first-ran").read_text() == "gone\n"  # the completed step was not run again


PRAGMAS = ["busy_timeout", "foreign_keys", "journal_mode", "synchronous"]


def connection_settings(engine: sa.Engine) -> dict[str, object]:
    with engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        settings = {pragma: raw.execute(f"PRAGMA {pragma}").fetchone()[0] for pragma in PRAGMAS}
        return {"isolation_level": raw.isolation_level, **settings}  # type: ignore[attr-defined]


def test_our_sqlite_system_engine_sets_what_dbos_sets_on_its_own_and_commits_without_syncing(tmp_path: Path) -> None:
    """`sqlite_engine` stands in for the engine DBOS makes (`system_database_engine`): it copies DBOS's connection
    settings (a PRAGMA DBOS adds in a new version fails this) and adds WAL and synchronous=NORMAL."""
    url = f"sqlite:///{tmp_path / 'dbos.sqlite'}"
    client = DBOSClient(system_database_url=url, application_name="contract", lazy=True)
    try:
        theirs = connection_settings(client._sys_db.engine)
    finally:
        client.destroy()
    ours_engine = sqlite_engine(url)
    try:
        ours = connection_settings(ours_engine)
    finally:
        ours_engine.dispose()
    assert ours == {**theirs, "journal_mode": "wal", "synchronous": 1}
    assert theirs["isolation_level"] == "IMMEDIATE" and theirs["foreign_keys"] == 1
    dbos_pragmas = set(re.findall(r"PRAGMA \w+=\w+", inspect.getsource(SQLiteSystemDatabase._create_engine)))
    assert dbos_pragmas and dbos_pragmas <= set(re.findall(r"PRAGMA \w+=\w+", inspect.getsource(sqlite_engine)))
