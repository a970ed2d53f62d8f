"""Shared fixtures: every test works on its own copy of the example units, never on the originals."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from unit_mcp import Host, UnitService

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_UNITS = REPO / "unit_mcp" / "examples" / "units"
FIXTURE_UNITS = REPO / "fixtures" / "units"


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
