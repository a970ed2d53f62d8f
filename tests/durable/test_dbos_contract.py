"""What `_durable.recover` relies on of DBOS: the private `DBOS._recover_pending_workflows([executor_id])` makes a
live process resume the workflows another executor left pending when it was SIGKILLed (DBOS 3 dropped the admin
server that offered this), completed steps are not run again, and a message sent meanwhile is received.
"""

from __future__ import annotations

import inspect
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from dbos import DBOS

from unit_mcp.agent._durable import DurableClient, recover

pytestmark = pytest.mark.anyio

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
    from unit_mcp.agent._durable import recover

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
    gone = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), "gone", "-"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
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
        live = await anyio.run_process([sys.executable, str(script), str(tmp_path), "live", "gone"], check=False)
    assert live.returncode == 0, live.stderr.decode()[-2000:]
    assert "result got yes" in live.stdout.decode().splitlines()
    assert (tmp_path / "first-ran").read_text() == "gone\n"  # the completed step was not run again
