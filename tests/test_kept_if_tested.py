"""Edits that keep only if the unit's test passes (`test` on unit_apply_patch, unit_create_source, unit_revert): the
write is made in the store, the test runs in the test host against it while the application serves the previous
version, and a failing run puts the write back before the call answers; the change log says which."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import LOADERS, copy_units, store_of

from unit_mcp import Host, UnitService
from unit_mcp.errors import UnitError
from unit_mcp.loader import Source

BREAKS = {"old": "    count += step\n", "new": "    count += step + 1\n"}  # increment() no longer adds one step
PASSES = {"old": "step = 1", "new": "step = 2"}


@pytest.fixture(params=LOADERS)
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[UnitService]:
    store = store_of(request, copy_units(tmp_path / "units"), tmp_path)
    with Host(store, tmp_path / "data") as host:
        yield UnitService(host, test_timeout=60)


def source(service: UnitService) -> bytes:
    return service.loader.read(Source("counter", "directory", "__init__.py"))


class Served:
    """What the live application serves while a call runs: `counter.increment`'s step, read in a loop."""

    def __init__(self, host: Host) -> None:
        self.host, self.seen, self.stop = host, set[int](), threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        while not self.stop.is_set():
            module = self.host.module("counter")
            if module is not None:
                self.seen.add(module.step)
            self.stop.wait(0.002)

    def __enter__(self) -> Served:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def test_a_patch_that_breaks_the_test_is_never_served_and_is_put_back(service: UnitService) -> None:
    before = source(service)
    module = service.host.module("counter")
    with Served(service.host) as served:
        result = service.apply_patch("counter", "__init__.py", **BREAKS, test="init")
    assert not result.kept and result.reload is None and result.changed
    assert result.test is not None and not result.test.passed and result.test.test_name == "init"
    assert "AssertionError" in result.test.stdout + result.test.stderr
    assert source(service) == before, "the write was put back"
    assert service.host.module("counter") is module, "the live unit was never reloaded"
    assert served.seen == {1}
    (record,) = service.changes(unit_id="counter", limit=1).changes
    assert (record.change_id, record.outcome, record.error_code) == (result.change_id, "rolled_back", "test_failed")
    assert record.message is not None and "test_init failed" in record.message and "put back" in record.message


def test_a_patch_whose_test_passes_is_kept_and_reloaded(service: UnitService) -> None:
    result = service.apply_patch("counter", "__init__.py", **PASSES, test="init")
    assert result.kept and result.test is not None and result.test.passed
    assert result.reload is not None and result.reload.reloaded
    assert service.host.module("counter").step == 2
    (record,) = service.changes(unit_id="counter", limit=1).changes
    assert (record.change_id, record.outcome) == (result.change_id, "applied")
    assert record.message is not None and "test_init passed" in record.message


def test_a_created_source_is_kept_on_its_test_and_an_unknown_test_writes_nothing(service: UnitService) -> None:
    created = service.create_source("counter", "extras.py", "BONUS = 3\n", test="init")
    assert created.kept and created.test is not None and created.test.passed and created.reload is not None
    with pytest.raises(UnitError) as refused:
        service.create_source("counter", "more.py", "MORE = 1\n", test="nosuch")
    assert refused.value.code == "unknown_source"
    assert "more.py" not in service.loader.source_ids("counter", "directory")
    failing = service.create_source("counter", "test_more.py", "def main():\n    assert False\n", test="more")
    assert not failing.kept and failing.test is not None and not failing.test.passed
    assert "test_more.py" not in service.loader.source_ids("counter", "directory"), "put back: removed again"


def test_short_output_with_a_host_path_is_redacted_not_truncated(tmp_path: Path) -> None:
    units = copy_units(tmp_path / "units", fixtures=False)
    where = "import units.counter as c\n\n\ndef main():\n    print(c.__file__)\n"
    (units / "counter" / "test_where.py").write_text(where)
    with Host(str(units), tmp_path / "data") as host:
        result = UnitService(host, test_timeout=60).run_tests("counter", "where")
    assert result.passed and "<units>/counter/__init__.py" in result.stdout and str(units) not in result.stdout
    assert result.redacted and not result.truncated
