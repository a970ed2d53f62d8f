"""Reload a unit when a human edits its files on disk; never touch the human's files.

`start()` returns once the watch is armed (the inotify watches are in place), so an edit made right after
it is seen. `watchfiles.watch` arms its watch lazily, inside the generator, on the watcher thread; this
module drives watchfiles' own `RustNotify` instead, created in `start()` itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from pathlib import Path

import watchfiles
from watchfiles._rust_notify import RustNotify

from . import paths


def _interesting(change: watchfiles.Change, path: str) -> bool:
    return not any(paths.is_hidden_or_compiled(part) for part in Path(path).parts)


class UnitWatcher:
    """A background thread waiting on a watchfiles `RustNotify` of the units root (debounced): calls
    `reload_changed(unit_id)` for a unit whose files changed, unless each change is the loader's own write."""

    def __init__(
        self,
        units_root: Path,
        is_own_write: Callable[[Path, str | None], bool],
        reload_changed: Callable[[str, Collection[str]], None],
        *,
        debounce_ms: int = 300,
    ) -> None:
        self.units_root = units_root
        self.is_own_write = is_own_write
        self.reload_changed = reload_changed
        self.debounce_ms = debounce_ms
        self._stop = threading.Event()
        self._notify: RustNotify | None = None
        self._thread = threading.Thread(target=self._run, name="unit-mcp-watcher", daemon=True)

    def start(self) -> None:
        """Arm the watch, then start the thread that reloads: an edit after this returns is seen."""
        self._notify = RustNotify([str(self.units_root)], False, False, 300, True, False)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        notify, self._notify = self._notify, None
        if notify is not None:
            notify.close()

    def _run(self) -> None:
        assert self._notify is not None
        while True:
            raw = self._notify.watch(self.debounce_ms, 50, 0, self._stop)
            if raw == "stop":
                return
            if isinstance(raw, set):
                changes = {(watchfiles.Change(c), path) for c, path in raw if _interesting(watchfiles.Change(c), path)}
                if changes:
                    self.handle(changes)

    def handle(self, changes: set[tuple[watchfiles.Change, str]]) -> None:
        by_unit: dict[str, list[tuple[Path, str]]] = {}
        for _change, raw in changes:
            path = Path(raw)
            try:
                relative = path.relative_to(self.units_root)
            except ValueError:
                continue
            if not relative.parts:
                continue
            first = relative.parts[0]
            file_unit = len(relative.parts) == 1 and first.endswith(".py")
            unit_id = first[:-3] if file_unit else first
            source_id = first if file_unit else "/".join(relative.parts[1:])
            by_unit.setdefault(unit_id, []).append((path, source_id))
        for unit_id, changed in sorted(by_unit.items()):
            outside = [sid for path, sid in changed if not self.is_own_write(path, _digest(path))]
            if outside:  # a change to the unit's folder itself has no source id, and still reloads
                self._reload(unit_id, {sid for sid in outside if sid})

    def _reload(self, unit_id: str, sources: Collection[str]) -> None:
        # a failed reload keeps the old version running; the file is never touched
        self.reload_changed(unit_id, sources)


def _digest(path: Path) -> str | None:
    try:
        return paths.hash_bytes(path.read_bytes()) if not path.is_symlink() else "symlink"
    except OSError:
        return None
