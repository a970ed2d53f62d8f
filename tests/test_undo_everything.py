"""Issue 36 items 1 and 2: a checkpoint holds every source's bytes (whoever wrote them) and, with `with_state`, each
unit's state; a rollback to it puts back every source, hash for hash, and the state with the code.

The randomized test runs 200 seeded sessions over the folder, SQLite and PostgreSQL loaders: each takes a
checkpoint, then mixes tool writes, direct edits of the store (picked up by the watcher), sources created and
removed, a `units copy` over a unit, and tool writes through a second server on the same store; then rolls back
(force: the direct edits are conflicts otherwise) and checks every source against what the loader listed at the
checkpoint: 0 missed, 0 extra.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import LOADERS, store_of

from unit_mcp import Host, UnitService
from unit_mcp.errors import UnitError
from unit_mcp.loader import Source, Written
from unit_mcp.units import open_loader

SESSIONS = int(os.environ.get("UNDO_SESSIONS", "200"))
UNITS = ("alpha", "beta", "gamma")


def make_units(root: Path) -> Path:
    """Three small directory units (no unit imports another, so any mix of their sources loads)."""
    for unit_id in UNITS:
        folder = root / unit_id
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text(f"NAME = {unit_id!r}\n# rev 0\n")
        (folder / "helper.py").write_text("def twice(x):\n    return 2 * x\n# rev 0\n")
        (folder / "data.txt").write_text("rev 0\n")
    return root


def listing(loader: object, unit_ids: tuple[str, ...] = UNITS) -> dict[tuple[str, str], str]:
    """(unit, source) → hash, as the loader lists them now."""
    found = {}
    for unit_id in unit_ids:
        kind = loader.kind(unit_id)  # type: ignore[attr-defined]
        for info in loader.sources(unit_id, kind):  # type: ignore[attr-defined]
            found[(unit_id, info.source_id)] = info.hash
    return found


@pytest.fixture(params=LOADERS)
def two_servers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Host, Host]]:
    """The store, the server under test (watching it) and a second server on the same store."""
    store = store_of(request, make_units(tmp_path / "units"), tmp_path)
    with (
        Host(store, tmp_path / "data", app_log=False) as first,
        Host(store, tmp_path / "data2", namespace="replica", app_log=False) as second,
    ):
        first.start_watching(debounce_ms=20)
        yield store, first, second


class Session:
    """One session's random writes, by every kind of writer."""

    def __init__(self, rng: random.Random, store: str, svc: UnitService, replica: UnitService, other: object) -> None:
        self.rng, self.store, self.svc, self.replica, self.other = rng, store, svc, replica, other
        self.direct: set[tuple[str, str]] = set()
        self.n = 0

    def mark(self) -> str:
        self.n += 1
        return f"{self.rng.randrange(10**9)}-{self.n}"

    def text(self, unit_id: str, source_id: str) -> str | None:
        kind = self.other.kind(unit_id)  # type: ignore[attr-defined]
        try:
            return bytes(self.other.read(Source(unit_id, kind, source_id))).decode()  # type: ignore[attr-defined]
        except Exception:
            return None

    def pick(self) -> tuple[str, str]:
        unit_id = self.rng.choice(UNITS)
        kind = self.other.kind(unit_id)  # type: ignore[attr-defined]
        return unit_id, self.rng.choice(self.other.source_ids(unit_id, kind))  # type: ignore[attr-defined]

    def step(self) -> None:
        how = self.rng.choice(["tool", "tool", "direct", "direct", "create", "remove", "replica", "copy"])
        unit_id, source_id = self.pick()
        text = self.text(unit_id, source_id)
        if text is None:
            return
        line = text.splitlines()[-1]
        new = f"# rev {self.mark()}" if source_id.endswith(".py") else f"rev {self.mark()}"
        try:
            if how in ("tool", "replica"):
                (self.svc if how == "tool" else self.replica).apply_patch(unit_id, source_id, old=line, new=new)
            elif how == "direct":
                self.write(unit_id, source_id, text.replace(line, new).encode())
            elif how == "create":
                name = f"extra_{self.mark().replace('-', '_')}.py"
                if self.rng.random() < 0.5:
                    self.svc.create_source(unit_id, name, "VALUE = 1\n")
                else:
                    self.write(unit_id, name, b"VALUE = 2\n", create=True)
            elif how == "remove" and source_id != "__init__.py":
                self.remove(unit_id, source_id, text.encode())
            elif how == "copy":  # `units copy` over the unit: every file of it, one changed
                kind = self.other.kind(unit_id)  # type: ignore[attr-defined]
                files = {
                    s: self.other.read(Source(unit_id, kind, s))  # type: ignore[attr-defined]
                    for s in self.other.source_ids(unit_id, kind)  # type: ignore[attr-defined]
                }
                files[source_id] = text.replace(line, new).encode()
                self.other.put_unit(unit_id, kind, files, replace=True)  # type: ignore[attr-defined]
                self.direct.add((unit_id, source_id))
        except UnitError:
            pass  # refused (e.g. stale: the watcher's reload raced it): nothing written, the session goes on

    def write(self, unit_id: str, source_id: str, data: bytes, *, create: bool = False) -> None:
        """A write by another program: a file written in place, or a row written over a connection of its own."""
        self.direct.add((unit_id, source_id))
        if not self.store.startswith(("sqlite:", "postgresql:")):
            path = Path(self.store) / unit_id / source_id
            path.write_bytes(data)
            return
        src = Source(unit_id, "directory", source_id)
        if create:
            self.other.create(src, data, tool_call="editor")  # type: ignore[attr-defined]
        else:
            current = self.other.read(src)  # type: ignore[attr-defined]
            from unit_mcp.paths import hash_bytes

            self.other.write(src, data, expected_hash=hash_bytes(current), tool_call="editor")  # type: ignore[attr-defined]

    def remove(self, unit_id: str, source_id: str, data: bytes) -> None:
        self.direct.add((unit_id, source_id))
        if not self.store.startswith(("sqlite:", "postgresql:")):
            (Path(self.store) / unit_id / source_id).unlink()
            return
        self.other.rollback(Written(Source(unit_id, "directory", source_id), data, None, "editor", token=[]))  # type: ignore[attr-defined]


def settled(host: Host) -> None:
    """Wait until the server's units are loaded again (a watcher's reload may be under way)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if all(host.is_loaded(u) for u in UNITS):
            return
        time.sleep(0.02)


def test_200_sessions_every_source_back_hash_for_hash(two_servers: tuple[str, Host, Host]) -> None:
    store, first, second = two_servers
    svc, replica = UnitService(first), UnitService(second)
    other = open_loader(store)
    loader = "sqlite" if store.startswith("sqlite:") else "postgres" if store.startswith("postgresql:") else "folder"
    rng = random.Random(f"issue 36 {loader}")  # seeded: the same 200 sessions every run
    totals = {"missed": 0, "extra": 0, "differ": 0, "changed": 0, "outside": 0}
    try:
        for session in range(SESSIONS):
            then = listing(other)
            mark = svc.checkpoint(label=f"session {session}", unit_ids=list(UNITS))
            work = Session(rng, store, svc, replica, other)
            for _ in range(rng.randint(2, 7)):
                work.step()
            moved = listing(other)
            totals["changed"] += sum(moved.get(k) != v for k, v in then.items()) + len(moved.keys() - then.keys())
            totals["outside"] += len(work.direct)
            svc.rollback(mark.checkpoint_id, force=True)
            now = listing(other)
            totals["missed"] += len(then.keys() - now.keys())
            totals["extra"] += len(now.keys() - then.keys())
            totals["differ"] += sum(now[k] != v for k, v in then.items() if k in now)
            assert now == then, f"session {session}: {sorted(set(now.items()) ^ set(then.items()))}"
            settled(first)
    finally:
        other.close()
    print(f"\n{SESSIONS} sessions over {loader}: {totals}")
    assert totals["missed"] == totals["extra"] == totals["differ"] == 0
    assert totals["changed"] > SESSIONS and totals["outside"] > SESSIONS / 2  # the sessions did change things


# -- state with code (item 2) -------------------------------------------------------------------------------------

STATEFUL = """import os
FLAG = os.path.join(os.environ["UNDO_TEST_FLAGS"], {flag!r})  # not the host path in the unit's text
COUNT = [0]


def bump(n=1):
    COUNT[0] += n


def snapshot():
    return {{"count": COUNT[0]}}


def restore(state):
    if os.path.exists(FLAG) and state["count"] < 10:
        raise RuntimeError("restore refused: the flag file is there and the count is low")
    COUNT[0] = state["count"]
# v1
"""


@pytest.fixture(params=LOADERS)
def stateful(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Host, UnitService, Path]]:
    """Two units with snapshot()/restore() (`alpha_state`, `zeta_state`), whose restore() refuses a count under 10
    while the unit's flag file is there."""
    root = tmp_path / "units"
    flag = tmp_path / "flag"
    monkeypatch.setenv("UNDO_TEST_FLAGS", str(tmp_path))
    for unit_id in ("alpha_state", "zeta_state"):
        (root / unit_id).mkdir(parents=True)
        (root / unit_id / "__init__.py").write_text(STATEFUL.format(flag="flag-" + unit_id))
    store = store_of(request, root, tmp_path)
    with Host(store, tmp_path / "data", app_log=False) as host:
        yield host, UnitService(host), flag


def count(host: Host, unit_id: str) -> int:
    module = host.module(unit_id)
    assert module is not None
    return int(module.COUNT[0])


def code(svc: UnitService, unit_id: str) -> str:
    return svc.read_source(unit_id, "__init__.py").content.splitlines()[-1]


def test_a_rollback_with_state_restores_code_and_state_together(stateful: tuple[Host, UnitService, Path]) -> None:
    host, svc, _ = stateful
    for unit_id, n in (("alpha_state", 2), ("zeta_state", 3)):
        host.module(unit_id).bump(n)  # type: ignore[union-attr]
    plain = svc.checkpoint(label="code only")
    mark = svc.checkpoint(label="with state", with_state=True)
    assert mark.with_state and not plain.with_state
    svc.apply_patch("alpha_state", "__init__.py", old="# v1", new="# v2")  # zeta_state: only its state moves on
    for unit_id in ("alpha_state", "zeta_state"):
        host.module(unit_id).bump(10)  # type: ignore[union-attr]
    assert (count(host, "alpha_state"), count(host, "zeta_state")) == (12, 13)  # the patch's reload kept the state

    dry = svc.rollback(mark.checkpoint_id, dry_run=True)
    assert [s.source_id for s in dry.sources] == ["__init__.py"] and count(host, "alpha_state") == 12
    done = svc.rollback(mark.checkpoint_id)
    assert code(svc, "alpha_state") == "# v1" and code(svc, "zeta_state") == "# v1"
    assert (count(host, "alpha_state"), count(host, "zeta_state")) == (2, 3)
    assert done.restored_state == ["alpha_state", "zeta_state"] and done.reloaded == ["alpha_state", "zeta_state"]

    # a checkpoint of code alone leaves the state as it is now
    host.module("alpha_state").bump(5)  # type: ignore[union-attr]
    svc.apply_patch("alpha_state", "__init__.py", old="# v1", new="# v3")
    back = svc.rollback(plain.checkpoint_id)
    assert code(svc, "alpha_state") == "# v1" and count(host, "alpha_state") == 7 and back.restored_state == []


def test_a_rollback_with_state_is_all_or_nothing_across_units(stateful: tuple[Host, UnitService, Path]) -> None:
    host, svc, flag = stateful
    host.module("alpha_state").bump(2)  # type: ignore[union-attr]
    host.module("zeta_state").bump(3)  # type: ignore[union-attr]
    mark = svc.checkpoint(with_state=True)
    for unit_id in ("alpha_state", "zeta_state"):
        svc.apply_patch(unit_id, "__init__.py", old="# v1", new="# v2")
        host.module(unit_id).bump(10)  # type: ignore[union-attr]
    Path(str(flag) + "-zeta_state").write_text("")  # zeta_state's restore() fails: alpha_state is reloaded first
    with pytest.raises(UnitError) as failed:
        svc.rollback(mark.checkpoint_id)
    assert failed.value.code == "reload_failed" and "Every source was put back" in failed.value.message
    # nothing changed: both units run the code and hold the state they had before the call
    assert (code(svc, "alpha_state"), code(svc, "zeta_state")) == ("# v2", "# v2")
    assert (count(host, "alpha_state"), count(host, "zeta_state")) == (12, 13)
    Path(str(flag) + "-zeta_state").unlink()
    svc.rollback(mark.checkpoint_id)
    assert (count(host, "alpha_state"), count(host, "zeta_state")) == (2, 3)
    assert (code(svc, "alpha_state"), code(svc, "zeta_state")) == ("# v1", "# v1")


def test_a_source_changed_outside_is_a_conflict_unless_force(two_servers: tuple[str, Host, Host]) -> None:
    store, first, _ = two_servers
    svc = UnitService(first)
    other = open_loader(store)
    try:
        then = listing(other)
        mark = svc.checkpoint(label="before", unit_ids=["alpha", "beta"])
        svc.apply_patch("alpha", "__init__.py", old="# rev 0", new="# rev 1")
        Session(random.Random(0), store, svc, svc, other).write("beta", "helper.py", b"def twice(x):\n    return x\n")
        kept = svc.rollback(mark.checkpoint_id)
        assert [(s.unit_id, s.source_id) for s in kept.sources] == [("alpha", "__init__.py")]
        assert [(c.unit_id, c.source_id) for c in kept.conflicts] == [("beta", "helper.py")]
        assert "since the checkpoint" in kept.conflicts[0].reason
        moved = listing(other)
        assert moved[("alpha", "__init__.py")] == then[("alpha", "__init__.py")]
        assert moved[("beta", "helper.py")] != then[("beta", "helper.py")]
        forced = svc.rollback(mark.checkpoint_id, force=True)
        assert [(s.unit_id, s.source_id, s.action) for s in forced.sources] == [("beta", "helper.py", "restored")]
        assert listing(other) == then
    finally:
        other.close()
