"""Edits that break a unit's reload, sent through the tools over HTTP: the previous version keeps serving with
its state and its activity, the file is put back, the evidence names the stage and the error, and the server
keeps answering other clients - even while a unit hangs."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from unit_mcp import Host

from .clients import call, connect, host_paths, leaks, visible
from .conftest import Served
from .report import Report

pytestmark = pytest.mark.anyio

INIT = "def init(host):\n"
LAST = '    count = int(state.get("count", 0))\n'

# name: (old, new, stage, what the evidence's error must say)
FAULTS: dict[str, tuple[str, str, str, str]] = {
    "import_error": ("import logging\n", "import logging\nimport no_such_module_for_hardening\n", "import",
                     "ModuleNotFoundError: No module named 'no_such_module_for_hardening'"),
    "exception_at_import": ("import logging\n", "import logging\n\nraise ValueError('import exploded')\n", "import",
                            "ValueError: import exploded"),
    "exception_in_init": (INIT, INIT + "    raise RuntimeError('init exploded')\n", "init",
                          "RuntimeError: init exploded"),
    "exception_in_restore": ("def restore(state):\n", "def restore(state):\n    raise KeyError('restore exploded')\n",
                             "restore", "KeyError: 'restore exploded'"),
    "removes_itself_from_sys_modules_at_import": (LAST, LAST + "\n\nimport sys\n\ndel sys.modules[__name__]\n",
                                                  "import", "KeyError: 'units.counter'"),
    "imports_itself_forever": ("import logging\n", "import logging\nimport sys\n\ndel sys.modules[__name__]\n",
                               "import", "RecursionError"),  # `from .panel import ...` re-imports the package
    "exit_at_import": ("import logging\n", "import logging\nimport sys\n\nsys.exit(3)\n", "import", "SystemExit: 3"),
    "hangs_at_import": ("import logging\n", "import logging\nimport time\n\ntime.sleep(3)\n", "import",
                        "did not finish within 1 s"),
}  # fmt: skip


@pytest.fixture
def counting(host: Host) -> Host:
    """The counter unit at count 3 with its activity active: state and activity a failed reload must keep."""
    host.reload_timeout = 1.0
    for _ in range(3):
        host.module("counter").increment()
    host.activate("counter")
    return host


async def patch(served: Served, old: str, new: str) -> Any:
    arguments = {"unit_id": "counter", "source_id": "__init__.py", "old": old, "new": new}
    async with connect(served.url, served.token) as client:
        return await call(client, "unit_apply_patch", arguments)


async def assert_previous_version_serves(served: Served, module: Any) -> None:
    async with connect(served.url, served.token) as client:
        snapshot = await call(client, "unit_snapshot", {"unit_id": "counter"})
        assert snapshot.structured is not None and snapshot.structured["state"] == {"count": 3}
        inspect = (await call(client, "unit_inspect", {"unit_id": "counter"})).structured
        assert inspect is not None and inspect["loaded"] and "load_error" not in inspect  # null: left out
        assert not (await call(client, "unit_list", {})).is_error
    assert served.host.module("counter") is module and module.increment() == 4 and module.drop is not None
    module.count = 3
    assert served.host.active_activity == "counter" and served.host.active_session is not None


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_failed_reload_keeps_the_previous_version_serving(
    served: Served, counting: Host, units_root: Path, fault: str, figures: Report
) -> None:
    old, new, stage, error = FAULTS[fault]
    source = units_root / "counter" / "__init__.py"
    before, module = source.read_bytes(), counting.module("counter")
    if fault != "hangs_at_import":  # the others end on their own: a recursion 1,000 imports deep took over 1 s
        counting.reload_timeout = 30.0  # at a load of 10 on 2 cores, and the evidence then named the timeout
    started = time.perf_counter()
    if fault == "hangs_at_import":  # other clients are served while the unit hangs
        answered: list[float] = []

        async def bystander() -> None:
            await anyio.sleep(0.3)
            async with connect(served.url, served.token) as client:
                asked = time.perf_counter()
                result = await call(client, "unit_read_source", {"unit_id": "greeter", "source_id": "greeter.py"})
                assert not result.is_error
                answered.append(time.perf_counter() - asked)

        async with anyio.create_task_group() as group:
            group.start_soon(bystander)
            result = await patch(served, old, new)
        assert answered and answered[0] < 1.5, f"a bystander waited {answered} s while a unit hung"
    else:
        result = await patch(served, old, new)
    elapsed = time.perf_counter() - started

    assert result.is_error and result.code == "reload_failed", result.text
    evidence = result.raw["_meta"]["unit_mcp/error"]["details"]
    assert evidence["stage"] == stage and error in evidence["error"], evidence
    assert evidence["rolled_back"] and evidence["source_restored"] and evidence["previous_version_serving"]
    assert evidence["active_activity_after"] == "counter"
    assert f"failed at {stage}" in result.text and "The previous source was restored" in result.text
    assert not leaks([visible(result)], host_paths(units_root.parent)), "the traceback names no host path"
    assert source.read_bytes() == before, "the file is put back byte for byte"
    await assert_previous_version_serves(served, module)
    if fault == "hangs_at_import":
        assert elapsed < 2.5, "the tool answered before the hung import returned"
        log = counting.log_path
        deadline = time.monotonic() + 10
        while "reload of unit counter returned late" not in log.read_text() and time.monotonic() < deadline:
            await anyio.sleep(0.1)
        assert sys.modules["units.counter"] is module, "the late import did not replace the served module"
    figures.record(
        "reload_faults",
        **{
            fault: {
                "stage": evidence["stage"],
                "error": evidence["error"][:80],
                "previous_version_serving": True,
                "state_kept": True,
                "source_restored": True,
                "seconds": round(elapsed, 2),
            }
        },
    )


async def test_a_syntax_error_is_refused_before_anything_is_written(
    served: Served, counting: Host, units_root: Path, figures: Report
) -> None:
    source = units_root / "counter" / "__init__.py"
    before, module = source.read_bytes(), counting.module("counter")
    result = await patch(served, "step = 1\n", "step = (1\n")
    assert result.is_error and result.code == "syntax_error", result.text
    details = result.raw["_meta"]["unit_mcp/error"]["details"]
    line = before.decode().splitlines().index("step = 1") + 1
    assert details["file"] == "__init__.py" and details["line"] == line and details["column"]
    assert "nothing was written" in result.text and source.read_bytes() == before
    await assert_previous_version_serves(served, module)

    # A human saves a broken sub-module on disk, then an agent asks for a reload: the old version keeps
    # serving and the human's file is left as it is.
    panel = units_root / "counter" / "panel.py"
    panel.write_text(panel.read_text() + "\ndef broken(:\n")
    async with connect(served.url, served.token) as client:
        reload = await call(client, "unit_reload", {"unit_id": "counter"})
    assert reload.is_error and reload.code == "reload_failed"
    evidence = reload.raw["_meta"]["unit_mcp/error"]["details"]
    assert evidence["stage"] == "import" and evidence["error"].startswith("SyntaxError: ")
    assert "<units>/counter/panel.py" in evidence["error"] and str(units_root) not in reload.text
    assert evidence["source_restored"] is False and panel.read_text().endswith("def broken(:\n")
    await assert_previous_version_serves(served, module)
    figures.record(
        "reload_faults",
        syntax_error_in_patch={"refused_as": "syntax_error", "line": details["line"], "written": False},
        syntax_error_on_disk_then_unit_reload={"stage": "import", "previous_version_serving": True, "file_kept": True},
    )


async def test_a_unit_that_deletes_its_lifecycle_functions_loses_no_state(served: Served, counting: Host) -> None:
    sabotage = INIT + "    for name in ('snapshot', 'restore'):\n        del globals()[name]\n"
    result = await patch(served, INIT, sabotage)
    state = counting.module("counter").count
    assert result.is_error or state == 3, f"reload reported {result.text[:300]} and the count went from 3 to {state}"


async def test_a_unit_that_removes_itself_from_sys_modules_during_init(served: Served, counting: Host) -> None:
    result = await patch(served, INIT, INIT + "    import sys\n\n    del sys.modules[__name__]\n")
    served_module = counting.module("counter")
    assert result.is_error or sys.modules.get("units.counter") is served_module


async def test_a_unit_whose_drop_hangs_does_not_wedge_the_server(served: Served, counting: Host) -> None:
    greeter = Path(counting.loader.location) / "greeter.py"
    greeter.write_text(greeter.read_text() + "\n\ndef drop():\n    import time\n\n    time.sleep(3)\n")
    async with connect(served.url, served.token) as client:
        assert not (await call(client, "unit_reload", {"unit_id": "greeter"})).is_error
    waited: list[float] = []

    async def bystander() -> None:
        await anyio.sleep(0.3)
        async with connect(served.url, served.token) as client:
            asked = time.perf_counter()
            assert not (await call(client, "unit_list", {})).is_error
            waited.append(time.perf_counter() - asked)

    async with anyio.create_task_group() as group, connect(served.url, served.token) as client:
        group.start_soon(bystander)
        await call(client, "unit_reload", {"unit_id": "greeter"})  # calls the hanging drop()
    assert waited[0] < 1.5, f"unit_list waited {waited[0]:.1f} s behind a hanging drop()"
