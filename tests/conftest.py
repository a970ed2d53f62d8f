"""Shared fixtures: every test works on its own copy of the example units, never on the originals."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.pgcluster import Cluster
from support.server_process import ServerProcess

from unit_mcp import Host, UnitService

pytest_plugins = [
    "support.resultcheck",  # no tool result holds a host path (checked at the end of the run)
    "support.cpu_report",  # each test's CPU, when UNIT_MCP_CPU_REPORT names a folder (docs/operations.md)
]

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_UNITS = REPO / "unit_mcp" / "examples" / "units"
FIXTURE_UNITS = REPO / "fixtures" / "units"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`--dist loadgroup`, scripts/test) the tests of a file that share a module- or class-scoped
    set-up (a built wheel, a server for the module) run on one worker, so that set-up is made once, not per worker."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        definitions = [] if info is None else info.name2fixturedefs.values()
        if any(chain and chain[-1].scope in ("module", "class", "package") for chain in definitions):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.partition("::")[0]))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The hardening figures this process measured: written to the report, or, in a pytest-xdist worker, handed to
    the controller, which writes one report from every worker's share (`pytest_testnodedown`)."""
    from hardening.report import REPORT

    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["hardening_report"] = REPORT.payload()
    else:
        REPORT.write()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """A pytest-xdist worker finished: add its hardening figures (see `pytest_sessionfinish`)."""
    from hardening.report import REPORT

    share = getattr(node, "workeroutput", {}).get("hardening_report")
    if share:
        REPORT.merge(share)


@pytest.fixture
def anyio_backend() -> str:
    """The one event loop of every async test: the package is asyncio-only (uvicorn, the SDK's transports)."""
    return "asyncio"


@pytest.fixture
def server_processes() -> Iterator[list[ServerProcess]]:
    """The servers a test starts in subprocesses (append them): each is killed after the test."""
    started: list[ServerProcess] = []
    yield started
    for process in started:
        process.kill()


def copy_units(target: Path, *, fixtures: bool = True) -> Path:
    shutil.copytree(EXAMPLE_UNITS, target, ignore=shutil.ignore_patterns("__pycache__"))
    if fixtures:
        shutil.copytree(FIXTURE_UNITS, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def sqlite_copy(folder: Path, db: Path) -> str:
    """The units of `folder` copied into a new database; its `--units` value."""
    from unit_mcp.units import copy_units as copy_between
    from unit_mcp.units import open_loader

    store = f"sqlite:{db}"
    source, target = open_loader(folder, read_only=True), open_loader(store)
    copy_between(source, target)
    target.close()
    return store


def postgres_copy(cluster: Cluster, folder: Path) -> str:
    """The units of `folder` copied into a new database of `cluster`; its `--units` value."""
    from unit_mcp.units import copy_units as copy_between
    from unit_mcp.units import open_loader

    store = cluster.new_database()
    source, target = open_loader(folder, read_only=True), open_loader(store)
    copy_between(source, target)
    target.close()
    return store


LOADERS = ["folder", "sqlite", "postgres"]


def store_of(request: pytest.FixtureRequest, folder: Path, tmp_path: Path) -> str:
    """`folder` as the store `request.param` names (one of LOADERS): itself, a SQLite copy or a copy in a new
    database of the session's PostgreSQL cluster (started by the first test that needs it)."""
    if request.param == "sqlite":
        return sqlite_copy(folder, tmp_path / "units.db")
    if request.param == "postgres":
        return postgres_copy(request.getfixturevalue("pg_cluster"), folder)
    return str(folder)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """One PostgreSQL cluster for the session (a new database per test); clients find its password in PGPASSFILE,
    which the servers the tests start inherit."""
    cluster = Cluster()
    try:
        cluster.start()
        os.environ["PGPASSFILE"] = str(cluster.passfile)
        yield cluster
    finally:
        os.environ.pop("PGPASSFILE", None)
        cluster.close()


def root_of(host: Host) -> Path:
    """The units folder of a host on the folder loader (tests that edit files directly)."""
    return Path(host.loader.location)


@pytest.fixture
def units_root(tmp_path: Path) -> Path:
    return copy_units(tmp_path / "units")


@pytest.fixture
def host(units_root: Path, tmp_path: Path) -> Iterator[Host]:
    with Host(units_root, tmp_path / "data") as started:
        yield started


@pytest.fixture
def service(host: Host) -> UnitService:
    return UnitService(host, test_timeout=30)
