"""The `Loader` protocol: where units live, behind one narrow interface the host and the service use for all storage.

Three implementations ship: `FilesystemLoader` (a folder, `folderloader.py`, with history when the folder is in a
git work tree), `SqliteLoader` (one SQLite database, `sqliteloader.py`) and `PostgresLoader` (`pgloader.py`, shared
by several servers), both with native history; `units.open_loader` turns a `--units` value (`DIR`, `sqlite:PATH`
or `postgresql://…`) into one of them. This module is the leaf of the loader layer: it
imports nothing of unit_mcp, and every loader, the host and the service import it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from .changelog import ChangeLog, Retention

UnitKind = Literal["directory", "file"]
SQLITE_PREFIX = "sqlite:"
STORES_PREFIX = "stores:"
"""An address of several stores served as one (`--units` given more than once): `stores:` and a JSON list."""


def stores_address(addresses: list[str]) -> str:
    """One address for several stores (what the test host opens again)."""
    return STORES_PREFIX + json.dumps(addresses)


def member_addresses(address: str) -> list[str]:
    """The stores an address names: itself, or each of a `stores:` address."""
    if not address.startswith(STORES_PREFIX):
        return [address]
    members = json.loads(address[len(STORES_PREFIX) :])
    if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
        raise ValueError("a stores: address is a JSON list of addresses")
    return members


@dataclass(frozen=True)
class Capabilities:
    read: bool = True
    write: bool = True
    create: bool = True
    history: bool = False

    def names(self) -> list[Literal["read", "write", "create", "history"]]:
        return [name for name in ("read", "write", "create", "history") if getattr(self, name)]


@dataclass(frozen=True)
class Source:
    """One source of a unit, checked once where it is made: the service checks a client's ids (the unit exists with
    this kind, `source_id` is a valid id of it); the importer and `units.copy_units` build handles from module
    names and listed ids. Loaders take it as given; the folder loader alone still keeps every path inside the
    units root (storage safety, not argument checking)."""

    unit_id: str
    kind: UnitKind
    source_id: str


@dataclass(frozen=True)
class SourceInfo:
    """One source of a unit as its loader lists it."""

    source_id: str
    size: int
    hash: str
    primary: bool
    kind: Literal["python", "text", "binary"]


@dataclass(frozen=True)
class Version:
    """One accepted version of a source. `version` numbers grow with time; `tool_call` is None for changes made
    outside the tools."""

    version: int
    hash: str
    size: int
    time: str
    tool_call: str | None


@dataclass
class Written:
    """What a loader write did, for `Loader.accept` (the reload succeeded) or `Loader.rollback` (it failed)."""

    source: Source
    data: bytes
    previous: bytes | None  # None: the source was created
    tool_call: str
    token: Any = None  # the loader's own bookkeeping (created folders, history row, ...)


# Refusals a loader raises; the service turns them into `UnitError`s. They never carry a host path.


class LoaderError(Exception):
    """Base of the storage refusals below."""


class MissingSource(LoaderError):
    """The source does not exist."""


class NotASource(LoaderError):
    """The source id names a folder (or something else that is not a source)."""


class PathConflict(LoaderError):
    """A folder on the source id's path is a source itself."""


class UnsafeSource(LoaderError):
    """The storage refuses the source (e.g. a symbolic link, or not a regular file)."""


class SourceExists(LoaderError):
    """`create` found the source already there."""


class StaleSource(LoaderError):
    """The source is no longer the bytes the write was based on (changed by someone else meanwhile)."""

    def __init__(self, current_hash: str | None) -> None:
        super().__init__(current_hash)
        self.current_hash = current_hash


class SourceTooLarge(LoaderError):
    """`read` with `max_bytes` found the source bigger than that (and did not read it)."""

    def __init__(self, size: int | None) -> None:
        super().__init__(size)
        self.size = size


class ForeignStore(LoaderError):
    """The store exists but is not a units store (another application's database): nothing was written to it.
    The message is one line for the operator, naming the store."""


class UnknownVersion(LoaderError):
    """No such version of the source in the history."""


class WatchTarget(Protocol):
    """What a loader's change watcher needs from the host (a `Host` is one)."""

    logger: Any

    def reload_changed(self, unit_id: str, sources: Collection[str] = ()) -> str | None:
        """Reload a unit someone else changed; `sources` are the ids changed outside the unit tools (for the
        change log; a change another server made through its tools is recorded by that server). Returns None, or
        why the change did not load (the old version serves)."""
        ...


@dataclass
class UnitVersions:
    """What this process serves of one unit against what the database holds (the newest version of any of its
    sources); `error` is why the newest did not load here, while the unit is behind."""

    served: int | None
    stored: int | None
    error: str | None = None

    @property
    def behind(self) -> bool:
        return self.served is not None and self.stored is not None and self.served < self.stored


class Watch(Protocol):
    def stop(self) -> None: ...


class Loader(Protocol):
    """Storage of units: discovery, sources (bytes with size and hash), hash-checked writes, optional history.

    A `Source` arrives checked (see there); `kind` may be asked about any name (None: no such unit), the other
    unit-level methods get the ids `discover` or `kind` found.
    A write is two-phase: `write`/`create` change the store at once (the reload that follows reads from it) and
    return a `Written`; the caller then calls `accept` when the reload succeeded or `rollback` when it did not.
    History loaders record accepted versions only.

    A loader subclasses `Loader` (the host refuses one that does not): the methods after `close` are optional,
    and the defaults here say "not offered".
    """

    name: str
    """Shown to clients as the unit's loader, e.g. 'filesystem' or 'sqlite'."""
    capabilities: Capabilities
    address: str
    """Opens the same store again in another process (the test host): a folder path or 'sqlite:PATH'."""
    location: str
    """The host path of the store, replaced by '<units>' in everything a client sees."""

    def discover(self) -> dict[str, UnitKind]:
        """Every unit id with its kind, sorted by id."""
        ...

    def kind(self, unit_id: str) -> UnitKind | None:
        """The kind of one unit, or None if there is none (cheap: called on every tool call)."""
        ...

    def source_ids(self, unit_id: str, kind: UnitKind) -> list[str]:
        """The unit's source ids, sorted, hidden and compiled files left out."""
        ...

    def sources(self, unit_id: str, kind: UnitKind) -> list[SourceInfo]:
        """Each source with its size and `sha256:` hash of the raw bytes."""
        ...

    def read(self, source: Source, *, max_bytes: int | None = None) -> bytes:
        """The source's bytes; with `max_bytes`, `SourceTooLarge` for a bigger source, found without reading it."""
        ...

    def origin(self, source: Source) -> str:
        """The name a source goes by in code objects and tracebacks (`__file__`); '<units>/…' once redacted."""
        ...

    def write(self, source: Source, data: bytes, *, expected_hash: str, tool_call: str) -> Written:
        """Replace an existing source, atomically checking that it still hashes to `expected_hash` (else
        `StaleSource`). Keeps what the store keeps of the old source (a file's mode, for instance)."""
        ...

    def create(self, source: Source, data: bytes, *, tool_call: str) -> Written:
        """Add a source that must not exist yet (`SourceExists` otherwise)."""
        ...

    def accept(self, written: Written) -> None:
        """The reload after the write succeeded: record the version (history loaders)."""
        ...

    def rollback(self, written: Written) -> None:
        """The reload after the write failed: put the previous bytes back (or remove a created source), checked
        like a write against the rejected bytes; if someone else changed the source meanwhile, their version stays
        and `StaleSource` says what the store holds. Either way the rejected version is not in the history."""
        ...

    def history(self, source: Source, limit: int) -> list[Version]:
        """Accepted versions of a source, newest first (loaders with the `history` capability)."""
        ...

    def version_data(self, source: Source, version: int) -> bytes:
        """The bytes of one version from `history` (`UnknownVersion` if there is none)."""
        ...

    def watch(self, target: WatchTarget, *, debounce_ms: int) -> Watch:
        """Start reloading units changed in the store by anyone else (debounced); returns once watching."""
        ...

    def put_unit(self, unit_id: str, kind: UnitKind, files: dict[str, bytes], *, replace: bool) -> None:
        """Store a whole unit at once (`unit_mcp.units copy`); `SourceExists` if it exists and not `replace`."""
        ...

    def close(self) -> None: ...

    # -- optional: the defaults say "not offered" ------------------------------------------------------------

    def write_checked(
        self, source: Source, data: bytes, *, expected_hash: str, tool_call: str, check: Callable[[], None]
    ) -> Written:
        """`write`, with `check` (the compile of the new bytes) run before they can be read: if it raises, nothing is
        written. The default runs it first; a loader may run it while it makes the write durable (the folder
        loader compiles while the file syncs)."""
        check()
        return self.write(source, data, expected_hash=expected_hash, tool_call=tool_call)

    @property
    def locations(self) -> list[str]:
        """Every host path of the store, each replaced by '<units>' in what a client sees (several stores: each)."""
        return [self.location]

    def change_log(self, retention: Retention) -> ChangeLog | None:
        """A change log in the store's own database, so that every server sharing the store sees every change;
        None: the host keeps one in its data dir."""
        return None

    def read_python_sources(self) -> dict[tuple[str, str], bytes] | None:
        """Every Python source by (unit id, source id) at once, for a store whose reads are round trips (the host's
        start imports from it); None: the host reads them one by one."""
        return None

    @contextlib.contextmanager
    def reading_all(self) -> Iterator[None]:
        """Around the host's start, which reads the modules of every unit in this thread: the store may keep open,
        for this thread's reads, what each read would open and close (the folder loader: the units root)."""
        yield

    def unit_versions(self, unit_ids: list[str]) -> dict[str, UnitVersions]:
        """What this server serves of each unit against what the store holds, for stores shared by several servers
        (`unit_inspect`'s `replica`); empty: the store is not shared."""
        return {}

    def source_stamps(self, units: Mapping[str, UnitKind]) -> dict[str, dict[str, Hashable | None]] | None:
        """A cheap mark of each source of `units` that changes whenever its bytes do (a file's inode, size, mtime
        and ctime; a database row's newest version), without reading the bytes: unit id -> source id -> stamp. A
        stamp of None vouches for nothing (the source changed too recently to tell); a unit left out, or None for
        all, is read in full (`sources`). The checkpoint reuses a source's hash while its stamp stays the same."""
        return None

    def unit_folder(self, unit_id: str) -> Path | None:
        """The unit's real folder on this machine (local access opens it); None: it has none (a single file, or a
        store that is not a folder)."""
        return None


def is_loader(store: object) -> bool:
    """Whether `store` subclasses `Loader`, as the host requires (it inherits the optional methods' defaults)."""
    return Loader in type(store).__mro__


def primary_source_id(unit_id: str, kind: UnitKind) -> str:
    """A unit's main module, the same in every store: `__init__.py` of a directory unit, `<unit>.py` of a file."""
    return "__init__.py" if kind == "directory" else f"{unit_id}.py"


def artifact_kind(source_id: str, data: bytes) -> Literal["python", "text", "binary"]:
    if b"\x00" in data[:8192]:
        return "binary"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return "binary"
    return "python" if source_id.endswith(".py") else "text"


def version_stamps(
    units: Mapping[str, UnitKind], rows: Iterable[tuple[str, str, int | None]], keep: Callable[[str, str], bool]
) -> dict[str, dict[str, Hashable | None]]:
    """`source_stamps` of a database store from (unit id, source id, newest version) rows: only the sources
    `source_ids` would list (`keep`; a file unit's one source); a source with no version row gets no stamp."""
    out: dict[str, dict[str, Hashable | None]] = {unit_id: {} for unit_id in units}
    for unit_id, source_id, version in rows:
        kind = units.get(unit_id)
        if kind is None or (kind == "file" and source_id != f"{unit_id}.py") or not keep(unit_id, source_id):
            continue
        out[unit_id][source_id] = None if version is None else int(version)
    return out
