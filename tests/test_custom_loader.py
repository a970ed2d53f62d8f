"""A third loader, written in the test from the protocol alone (units in a dict): the host and the service need
nothing else from storage. Also: a `Host` given a loader leaves it open when it closes."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from unit_mcp import Host, UnitService
from unit_mcp.errors import UnitError
from unit_mcp.loader import (
    Capabilities,
    Loader,
    MissingSource,
    Source,
    SourceExists,
    SourceInfo,
    SourceTooLarge,
    StaleSource,
    UnitKind,
    UnknownVersion,
    Version,
    WatchTarget,
    Written,
    artifact_kind,
    primary_source_id,
)
from unit_mcp.paths import hash_bytes
from unit_mcp.sqliteloader import SqliteLoader


class MemoryLoader(Loader):
    name = "memory"
    capabilities = Capabilities()
    address = "memory:"
    location = "/memory-units"

    def __init__(self, units: dict[str, tuple[UnitKind, dict[str, bytes]]]) -> None:
        self.units = units

    def discover(self) -> dict[str, UnitKind]:
        return {unit_id: kind for unit_id, (kind, _) in sorted(self.units.items())}

    def kind(self, unit_id: str) -> UnitKind | None:
        return self.units[unit_id][0] if unit_id in self.units else None

    def source_ids(self, unit_id: str, kind: UnitKind) -> list[str]:
        return sorted(self.units[unit_id][1])

    def sources(self, unit_id: str, kind: UnitKind) -> list[SourceInfo]:
        primary = primary_source_id(unit_id, kind)
        files = self.units[unit_id][1]
        return [
            SourceInfo(sid, len(data), hash_bytes(data), sid == primary, artifact_kind(sid, data))
            for sid, data in sorted(files.items())
        ]

    def read(self, source: Source, *, max_bytes: int | None = None) -> bytes:
        try:
            data = self.units[source.unit_id][1][source.source_id]
        except KeyError:
            raise MissingSource() from None
        if max_bytes is not None and len(data) > max_bytes:
            raise SourceTooLarge(len(data))
        return data

    def origin(self, source: Source) -> str:
        return f"{self.location}/{source.unit_id}/{source.source_id}"

    def write(self, source: Source, data: bytes, *, expected_hash: str, tool_call: str) -> Written:
        previous = self.read(source)
        if hash_bytes(previous) != expected_hash:
            raise StaleSource(hash_bytes(previous))
        self.units[source.unit_id][1][source.source_id] = data
        return Written(source, data, previous, tool_call)

    def create(self, source: Source, data: bytes, *, tool_call: str) -> Written:
        if source.source_id in self.units[source.unit_id][1]:
            raise SourceExists()
        self.units[source.unit_id][1][source.source_id] = data
        return Written(source, data, None, tool_call)

    def accept(self, written: Written) -> None:
        pass

    def rollback(self, written: Written) -> None:
        files = self.units[written.source.unit_id][1]
        current = files.get(written.source.source_id)
        if current != written.data:
            raise StaleSource(None if current is None else hash_bytes(current))
        if written.previous is None:
            del files[written.source.source_id]
        else:
            files[written.source.source_id] = written.previous

    def history(self, source: Source, limit: int) -> list[Version]:
        return []

    def version_data(self, source: Source, version: int) -> bytes:
        raise UnknownVersion(version)

    def watch(self, target: WatchTarget, *, debounce_ms: int) -> MemoryLoader:
        return self  # nobody else writes to a dict

    def stop(self) -> None:
        pass

    def put_unit(self, unit_id: str, kind: UnitKind, files: dict[str, bytes], *, replace: bool) -> None:
        self.units[unit_id] = (kind, dict(files))

    def close(self) -> None:
        pass


def test_a_loader_written_from_the_protocol_alone_serves_every_storage_operation(tmp_path: Path) -> None:
    loader = MemoryLoader(
        {
            "counter": (
                "directory",
                {"__init__.py": b"from .parts import STEP\n\ncount = 0\n", "parts.py": b"STEP = 1\n"},
            ),
            "greeter": ("file", {"greeter.py": b'def greet(name):\n    return f"Hello, {name}!"\n'}),
        }
    )
    with Host(loader, tmp_path / "data") as host:
        service = UnitService(host)
        units = {u.unit_id: u for u in service.list().units}
        assert set(units) == {"counter", "greeter"} and all(u.loaded and u.loader == "memory" for u in units.values())
        assert host.module("counter").STEP == 1
        read = service.read_source("counter", "parts.py")
        service.apply_patch("counter", "parts.py", old="STEP = 1", new="STEP = 2", expected_hash=read.hash)
        assert host.module("counter").STEP == 2 and loader.units["counter"][1]["parts.py"] == b"STEP = 2\n"
        with pytest.raises(UnitError) as failed:
            service.apply_patch("counter", "parts.py", old="STEP = 2", new="STEP = 1 / 0")
        assert failed.value.code == "reload_failed" and loader.units["counter"][1]["parts.py"] == b"STEP = 2\n"
        service.create_source("counter", "extra.py", "EXTRA = 1\n")
        assert "extra.py" in [a.source_id for a in service.inspect("counter").source_artifacts]
        assert inspect.getsource(host.module("greeter")).startswith("def greet(name):")
        assert service.resolve("greet people").candidates[0].unit_id == "greeter"
        with pytest.raises(UnitError) as refused:
            service.history("greeter", "greeter.py")
        assert refused.value.code == "not_supported"
        host.start_watching()


def test_a_host_given_a_loader_leaves_it_open(tmp_path: Path) -> None:
    loader = SqliteLoader(tmp_path / "units.db")
    loader.put_unit("greeter", "file", {"greeter.py": b"NAME = 'x'\n"}, replace=False)
    with Host(loader, tmp_path / "data") as host:
        assert host.module("greeter").NAME == "x"
    assert loader.discover() == {"greeter": "file"}  # still usable by its owner
    loader.close()


def test_a_loader_that_does_not_subclass_the_protocol_is_refused_with_what_to_do(tmp_path: Path) -> None:
    """The optional members (change log, locations, local folder, ...) have their defaults in `Loader`: a duck-typed
    loader would miss them at its first use, so the host refuses it at once, writing nothing."""

    class Duck:
        name, capabilities, address, location = "duck", Capabilities(), "duck:", "/duck"

    with pytest.raises(TypeError, match=r"Duck is not a Loader: a custom loader subclasses unit_mcp\.loader\.Loader"):
        Host(Duck(), tmp_path / "data")  # type: ignore[arg-type]
    assert not (tmp_path / "data").exists()
    memory = MemoryLoader({})
    assert (memory.locations, memory.change_log(None), memory.unit_folder("x")) == (["/memory-units"], None, None)  # type: ignore[arg-type]
    assert memory.read_python_sources() is None and memory.unit_versions(["x"]) == {}
