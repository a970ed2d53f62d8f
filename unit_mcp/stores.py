"""Several stores served as one (`--units` given more than once): each unit from the store that holds it.

`Stores` is a `Loader` over member loaders (a folder beside a `sqlite:` or `postgresql://` store, say). A unit id
held by two stores is refused when they are opened together (`DuplicateUnits`), so every unit has exactly one
store; writes, history and watching go to that store, and the host keeps one change log for all of them in its
data dir, so checkpoints and rollbacks span the stores (a rollback across two stores is all or nothing, as it is
across units). A capability is offered when every store has it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from pathlib import Path

from .loader import (
    Capabilities,
    Loader,
    LoaderError,
    MissingSource,
    Source,
    SourceInfo,
    UnitKind,
    Version,
    Watch,
    WatchTarget,
    Written,
    stores_address,
)


class DuplicateUnits(LoaderError):
    """Two stores hold a unit of the same id: which one to serve would be a guess. The message names them."""


class _Watches:
    def __init__(self, watches: list[Watch]) -> None:
        self.watches = watches

    def stop(self) -> None:
        for watch in self.watches:
            watch.stop()


class Stores(Loader):
    """A `Loader` over several member loaders; each unit lives in exactly one of them."""

    def __init__(self, members: Sequence[Loader]) -> None:
        self.members = list(members)
        self.name = "+".join(dict.fromkeys(m.name for m in self.members))
        caps = [m.capabilities for m in self.members]
        self.capabilities = Capabilities(
            read=all(c.read for c in caps),
            write=all(c.write for c in caps),
            create=all(c.create for c in caps),
            history=all(c.history for c in caps),
        )
        self.address = stores_address([m.address for m in self.members])
        self.location = self.members[0].location
        self._holder: dict[str, Loader] = {}
        self.discover()

    def _of(self, unit_id: str) -> Loader:
        holder = self._holder.get(unit_id)
        if holder is not None and holder.kind(unit_id) is not None:
            return holder
        for member in self.members:
            if member.kind(unit_id) is not None:
                self._holder[unit_id] = member
                return member
        raise MissingSource(unit_id)

    def discover(self) -> dict[str, UnitKind]:
        found: dict[str, UnitKind] = {}
        held: dict[str, Loader] = {}
        twice: list[str] = []
        for member in self.members:
            for unit_id, kind in member.discover().items():
                if unit_id in held:
                    twice.append(f"{unit_id} (in {held[unit_id].location} and {member.location})")
                    continue
                held[unit_id], found[unit_id] = member, kind
        if twice:
            raise DuplicateUnits(
                f"hold units of the same id: {', '.join(twice[:5])}{' …' if len(twice) > 5 else ''}; a unit id may "
                "be in one store only: rename or remove one"
            )
        self._holder = held
        return dict(sorted(found.items()))

    def kind(self, unit_id: str) -> UnitKind | None:
        try:
            return self._of(unit_id).kind(unit_id)
        except MissingSource:
            return None

    def source_ids(self, unit_id: str, kind: UnitKind) -> list[str]:
        return self._of(unit_id).source_ids(unit_id, kind)

    def sources(self, unit_id: str, kind: UnitKind) -> list[SourceInfo]:
        return self._of(unit_id).sources(unit_id, kind)

    def source_stamps(self, units: Mapping[str, UnitKind]) -> dict[str, dict[str, Hashable | None]]:
        """Each member's stamps of its own units (a member that offers none leaves its units out: read in full)."""
        mine: dict[int, dict[str, UnitKind]] = {}
        for unit_id, kind in units.items():
            with contextlib.suppress(MissingSource):
                mine.setdefault(id(self._of(unit_id)), {})[unit_id] = kind
        out: dict[str, dict[str, Hashable | None]] = {}
        for member in self.members:
            if id(member) in mine:
                out.update(member.source_stamps(mine[id(member)]) or {})
        return out

    def read(self, source: Source, *, max_bytes: int | None = None) -> bytes:
        return self._of(source.unit_id).read(source, max_bytes=max_bytes)

    def origin(self, source: Source) -> str:
        return self._of(source.unit_id).origin(source)

    def write(self, source: Source, data: bytes, *, expected_hash: str, tool_call: str) -> Written:
        return self._of(source.unit_id).write(source, data, expected_hash=expected_hash, tool_call=tool_call)

    def write_checked(
        self, source: Source, data: bytes, *, expected_hash: str, tool_call: str, check: Callable[[], None]
    ) -> Written:
        member = self._of(source.unit_id)
        return member.write_checked(source, data, expected_hash=expected_hash, tool_call=tool_call, check=check)

    def create(self, source: Source, data: bytes, *, tool_call: str) -> Written:
        return self._of(source.unit_id).create(source, data, tool_call=tool_call)

    def accept(self, written: Written) -> None:
        self._of(written.source.unit_id).accept(written)

    def rollback(self, written: Written) -> None:
        self._of(written.source.unit_id).rollback(written)

    def history(self, source: Source, limit: int) -> list[Version]:
        return self._of(source.unit_id).history(source, limit)

    def version_data(self, source: Source, version: int) -> bytes:
        return self._of(source.unit_id).version_data(source, version)

    def watch(self, target: WatchTarget, *, debounce_ms: int) -> Watch:
        return _Watches([member.watch(target, debounce_ms=debounce_ms) for member in self.members])

    def put_unit(self, unit_id: str, kind: UnitKind, files: dict[str, bytes], *, replace: bool) -> None:
        holder = self._holder.get(unit_id, self.members[0])
        holder.put_unit(unit_id, kind, files, replace=replace)
        self._holder[unit_id] = holder

    @property
    def locations(self) -> list[str]:
        return [m.location for m in self.members]

    def unit_folder(self, unit_id: str) -> Path | None:
        return self._of(unit_id).unit_folder(unit_id)

    @contextlib.contextmanager
    def reading_all(self) -> Iterator[None]:
        with contextlib.ExitStack() as members:
            for member in self.members:
                members.enter_context(member.reading_all())
            yield

    def close(self) -> None:
        for member in self.members:
            member.close()
