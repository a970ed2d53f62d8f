"""The headless engine: the units of one loader, their activities, transactional reload and the app log."""

from __future__ import annotations

import contextlib
import contextvars
import gc
import importlib
import importlib.machinery
import importlib.util
import logging
import os
import queue
import secrets
import sys
import threading
import time
import traceback
import types
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import applog, cancel, paths, reloading
from .activities import Activities
from .changelog import DEFAULT_RETENTION, NOBODY, Caller, ChangeLog, Retention, SqliteChangeLog
from .importer import BytecodeCache, UnitFinder
from .loader import Loader, LoaderError, Source, SourceTooLarge, UnitKind, Watch, is_loader
from .redact import Redactor
from .reloading import (
    OWN_STATE,
    DrainTimeout,
    Gate,
    HostLock,
    LoadedUnit,
    Progress,
    Reloaded,
    ReloadError,
    ReloadTimeout,
    held_uses,
    install,
    lifecycle_of,
    version_of,
)
from .units import open_loader

if TYPE_CHECKING:
    from .githistory import GitMode

KEPT_SNAPSHOTS = 64
KEPT_SNAPSHOT_BYTES = 64 * 1024 * 1024
"""Captured snapshots kept in memory for `restore_snapshot`: the newest 64, at most 64 MiB of JSON in all."""
_claimed_namespaces: dict[str, Host] = {}
_claim_lock = threading.Lock()


class UnitNotLoaded(LookupError):
    """A use of a unit that is not loaded (never loaded, failed to load, or unloaded)."""

    def __init__(self, unit_id: str) -> None:
        super().__init__(f"unit {unit_id!r} is not loaded")
        self.unit_id = unit_id


class UnitUse:
    """One use of a unit by the application: `with host.use("counter") as module:` in a thread, or `async with` in
    an asyncio task. While a reload of the unit is in its window the use waits (it never fails for that); once
    entered, the module it got is not swapped under it: a reload waits for it to finish (up to the host's
    `drain_timeout`). `release()` ends it early (an ASGI response that starts streaming: its body is its own)."""

    def __init__(self, host: Host, unit_id: str) -> None:
        self._host = host
        self.unit_id = unit_id
        self._gate = host._gate(unit_id)
        self._key = (id(host), unit_id)
        self._entered = False
        self._token: contextvars.Token[frozenset[tuple[int, str]]] | None = None
        self.module: types.ModuleType | None = None

    def _entering(self) -> bool:
        if self._entered or self._token is not None:
            raise RuntimeError("a UnitUse is entered once; call host.use() again for another use")
        return self._key in held_uses.get()

    def _admitted(self) -> types.ModuleType:
        self._entered = True
        loaded = self._host._loaded.get(self.unit_id)
        if loaded is None:
            self.release()
            raise UnitNotLoaded(self.unit_id)
        self._token = held_uses.set(held_uses.get() | {self._key})
        self.module = loaded.module
        return loaded.module

    def release(self) -> None:
        """Let a waiting reload go on (idempotent); the module stays what this use got. A use made after this, in
        the same thread or task, is a use of its own that waits for a reload's window like any other."""
        if self._entered:
            self._entered = False
            self._gate.leave()
            held = held_uses.get()
            if self._key in held:
                held_uses.set(held - {self._key})

    def __enter__(self) -> types.ModuleType:
        self._gate.enter(self._entering())
        return self._admitted()

    def __exit__(self, *exc: object) -> None:
        self._exit()

    async def __aenter__(self) -> types.ModuleType:
        nested = self._entering()
        while (future := self._gate.enter_or_wait(nested)) is not None:
            try:
                await future
            except BaseException:  # cancelled while waiting: nobody needs waking any more
                future.cancel()
                raise
        return self._admitted()

    async def __aexit__(self, *exc: object) -> None:
        self._exit()

    def _exit(self) -> None:
        self.release()
        token, self._token = self._token, None
        if token is not None:
            with contextlib.suppress(ValueError):  # exited in another context than entered: nothing to undo there
                held_uses.reset(token)


class RestoreError(Exception):
    """A unit's restore() failed on a snapshot's state; `rolled_back` says whether the state before was put back."""

    def __init__(self, error: BaseException, rolled_back: bool) -> None:
        super().__init__(repr(error))
        self.error = error
        self.rolled_back = rolled_back


class _Worker:
    """One reusable daemon thread that runs unit code (a thread per reload costs more than the reload)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def stop(self) -> None:
        """The thread ends after its current job, if that job ever returns."""
        self._jobs.put(None)


class Host:
    """Hosts the units of one loader under a namespace package (default `units`).

    All module work happens under one re-entrant lock (sys.modules is global);
    `unit_lock(unit_id)` serialises edit-then-reload sequences of one unit.
    """

    def __init__(
        self,
        units: Loader | str | os.PathLike[str],
        data_dir: str | os.PathLike[str],
        *,
        namespace: str = "units",
        read_only: bool = False,
        log_max_bytes: int = 5 * 1024 * 1024,
        log_backups: int = 3,
        reload_timeout: float = 30.0,
        drain_timeout: float = 10.0,
        app_log: bool = True,
        git_history: GitMode = "ref",
        change_retention: Retention = DEFAULT_RETENTION,
        max_change_bytes: int = 2 * 1024 * 1024,
    ) -> None:
        """`units` is a loader, or what `open_loader` opens (a folder, `sqlite:PATH`); a loader opened here is
        closed with the host. `app_log=False` writes no `<data_dir>/logs/app.log` (the test host logs to its
        stderr instead). The data dir must be ours alone (`paths.private_dir`): its bytecode cache is run. The
        change log (`changes`) keeps `change_retention` and the bytes of an outside change up to
        `max_change_bytes`. A reload waits up to `drain_timeout` seconds for the unit's uses in flight to finish,
        then is refused (the old version serving on)."""
        if not isinstance(units, (str, os.PathLike)) and not is_loader(units):
            raise TypeError(
                f"{type(units).__name__} is not a Loader: a custom loader subclasses unit_mcp.loader.Loader "
                "(docs/loaders.md), which gives the optional methods their defaults"
            )
        self.data_dir = paths.private_dir(Path(data_dir))
        if isinstance(units, (str, os.PathLike)):
            units = open_loader(units, read_only=read_only, git_history=git_history)
            self._owns_loader = True
        else:
            self._owns_loader = False
        self.loader: Loader = units
        self.namespace = namespace
        self.log_path = self.data_dir / "logs" / "app.log"
        self.logger = logging.getLogger("unit_mcp.host")
        self.redact = Redactor([*((where, "<units>") for where in self.loader.locations), (self.data_dir, "<data>")])
        self._log_max_bytes = log_max_bytes
        self.log_backups = log_backups
        self.app_log = app_log
        self._lock = HostLock()
        self._unit_locks: dict[str, threading.RLock] = {}
        self._locks_lock = threading.Lock()
        self._loaded: dict[str, LoadedUnit] = {}
        self._load_errors: dict[str, str] = {}
        self._activities = Activities(self.logger)
        self._initialising: str | None = None
        self._transaction_thread: int | None = None
        self._worker: _Worker | None = None
        self.reload_timeout = reload_timeout
        self.drain_timeout = drain_timeout
        self._gates: dict[str, Gate] = {}
        self._pending_activities: list[str] = []
        self._finder: UnitFinder | None = None
        self._log_handler: logging.Handler | None = None
        self._watcher: Watch | None = None
        self._saving: threading.Thread | None = None
        self._started = False
        self.change_retention = change_retention
        self.max_change_bytes = max_change_bytes
        self._changes: ChangeLog | None = None
        self._changes_lock = threading.Lock()
        # Called with a unit id after each reload or unload of that unit, whatever its outcome (e.g. to re-index it).
        self.unit_listeners: list[Callable[[str], object]] = []
        self.outside_caller: Callable[[str], Caller] = lambda unit_id: NOBODY
        """Who made an outside change of a unit, where something knows (a local-access grant), for the change log."""
        self._snapshots: OrderedDict[str, tuple[str, str]] = OrderedDict()  # id -> (unit id, state as JSON)
        self._snapshot_bytes = 0

    # -- start / stop -----------------------------------------------------------------

    def start(self, unit_ids: Sequence[str] | None = None) -> Host:
        """Claim the namespace, open the app log and load units (all by default); load errors are recorded."""
        with self._guard():
            if self._started:
                return self
            with _claim_lock:
                holder = _claimed_namespaces.get(self.namespace)
                if holder is not None and holder is not self:
                    raise RuntimeError(f"namespace {self.namespace!r} is already used by another open Host")
                _claimed_namespaces[self.namespace] = self
            if self.app_log:
                self._log_handler = applog.open_app_log(
                    self.log_path, max_bytes=self._log_max_bytes, backups=self.log_backups
                )
            self._install_namespace()
            self._started = True
            started = time.perf_counter()
            # No cyclic GC while discovering and loading: each full collection walks every object there is (the
            # modules loaded so far, and what a host closed in this process left to collect), and with thousands
            # of units they were a third of the start's CPU time.
            collecting = gc.isenabled()
            gc.disable()
            try:
                discovered = self.loader.discover() if unit_ids is None else None
                ids = list(discovered if discovered is not None else unit_ids or ())
                assert self._finder is not None
                self._finder.kinds = discovered  # a lookup per unit less while starting
                # A store whose reads are round trips gives every source at once: a query per source less.
                self._finder.prefetched = self.loader.read_python_sources() if discovered is not None else None
                # A full start reuses the code compiled at the last one (a partial start, like the test host's,
                # would read the whole cache for one unit, and must not shrink it).
                cache = None if discovered is None else paths.private_dir(self.data_dir, "bytecode") / "units"
                bytecode = None if cache is None else BytecodeCache(cache).load()
                self._finder.bytecode = bytecode
                pending = ids
                while pending:
                    pending = self._bring_up_batch(pending)
            finally:
                if self._finder is not None:
                    self._finder.kinds = None
                    self._finder.prefetched = None
                    self._finder.bytecode = None
                if collecting:
                    gc.enable()
            if bytecode is not None:  # after the start, not in it (30-65 ms for 10,000 units); close() waits for it
                self._saving = threading.Thread(
                    target=self._save_bytecode, args=(bytecode,), name="unit-mcp-bytecode", daemon=True
                )
                self._saving.start()
            failed = [unit_id for unit_id in ids if unit_id in self._load_errors]
            self.logger.info(
                "started: %d units loaded in %.1f ms%s",
                len(ids) - len(failed),
                (time.perf_counter() - started) * 1000,
                f", {len(failed)} failed: {', '.join(failed[:20])}{' …' if len(failed) > 20 else ''}" if failed else "",
            )
            return self

    def _save_bytecode(self, bytecode: BytecodeCache) -> None:
        try:
            bytecode.save()
        except OSError as exc:
            self.logger.warning("the bytecode cache was not saved: %s", self.redact(str(exc)))

    def _bring_up_batch(self, unit_ids: list[str]) -> list[str]:
        """Load units at start, one after another in ONE job of the reload worker (a hand-off per unit cost more
        than most units' import). Each unit still gets `reload_timeout` seconds: a unit that hangs is given up
        on, recorded as failed, and the units after it are returned for a new worker. A failure is recorded and
        logged as a reload's is; nothing was loaded before, so nothing is rolled back."""
        marker: list[Any] = [0, time.perf_counter(), Progress()]
        abandoned = threading.Event()
        done = threading.Event()
        escaped: list[BaseException] = []

        def run() -> None:
            self._transaction_thread = threading.get_ident()
            try:
                with self.loader.reading_all():
                    for index, unit_id in enumerate(unit_ids):
                        if abandoned.is_set():
                            return
                        progress = Progress()
                        marker[:] = [index, time.perf_counter(), progress]
                        try:
                            new = self._bring_up(unit_id, progress)
                        except (Exception, SystemExit) as exc:
                            if abandoned.is_set():
                                with self._lock:
                                    self._resync_modules(unit_id)
                                self.logger.warning("a timed-out start of unit %s returned late; discarded", unit_id)
                                return
                            self._discard(unit_id)
                            self._load_errors[unit_id] = self._describe(exc)
                            self._failure(
                                unit_id, progress.stage, exc, rolled_back=False, source_restored=False, first=True
                            )
                            continue
                        self._loaded[unit_id] = new
                        self._load_errors.pop(unit_id, None)
            except BaseException as exc:
                escaped.append(exc)
            finally:
                done.set()

        if self._worker is None:
            self._worker = _Worker("unit-mcp-reload")
        self._worker.submit(run)
        while not done.wait(0.05):
            index, since, progress = marker
            if time.perf_counter() - since < self.reload_timeout:
                continue
            abandoned.set()
            self._transaction_thread = None
            self._worker.stop()
            self._worker = None
            unit_id = unit_ids[index]
            self._discard(unit_id)
            exc = ReloadTimeout(f"{progress.stage} of unit {unit_id} did not finish within {self.reload_timeout:g} s")
            self._load_errors[unit_id] = self._describe(exc)
            self._failure(unit_id, progress.stage, exc, rolled_back=False, source_restored=False, first=True)
            return unit_ids[index + 1 :]
        self._transaction_thread = None
        if escaped:
            raise escaped[0]
        return []

    def close(self) -> None:
        """Stop watching, deactivate, drop every unit, release the namespace and the log (and the loader if the
        host opened it)."""
        self.stop_watching()
        saving, self._saving = self._saving, None
        if saving is not None:
            saving.join()
        with self._guard():
            if not self._started:
                return
            self.deactivate()
            for unit_id in list(self._loaded):
                self._teardown(self._loaded.pop(unit_id))
            if self._finder in sys.meta_path:
                sys.meta_path.remove(self._finder)
            sys.modules.pop(self.namespace, None)
            with _claim_lock:
                if _claimed_namespaces.get(self.namespace) is self:
                    del _claimed_namespaces[self.namespace]
            if self._log_handler is not None:
                applog.close_app_log(self._log_handler)
                self._log_handler = None
            if self._worker is not None:
                self._worker.stop()
                self._worker = None
            if self._owns_loader:
                self.loader.close()  # a loader reopens on use: a closed host may be started again
            with self._changes_lock:
                changes, self._changes = self._changes, None
            if changes is not None:
                changes.close()
            self._started = False

    def __enter__(self) -> Host:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _install_namespace(self) -> None:
        spec = importlib.machinery.ModuleSpec(self.namespace, None, is_package=True)
        spec.submodule_search_locations = []
        package = importlib.util.module_from_spec(spec)
        package.__path__ = []  # its units come from `self._finder`, never from sys.path
        sys.modules[self.namespace] = package
        self._finder = UnitFinder(self.namespace, self.loader)
        sys.meta_path.insert(0, self._finder)

    # -- discovery and queries -----------------------------------------------------------

    def unit_kinds(self) -> dict[str, UnitKind]:
        return self.loader.discover()

    def unit_kind(self, unit_id: str) -> UnitKind | None:
        return self.loader.kind(unit_id)

    def module_name(self, unit_id: str) -> str:
        return f"{self.namespace}.{unit_id}"

    # Queries take no lock: a reload keeps the old version listed until the new one replaces it, so a
    # reader never sees a unit half-way, and a hanging drop() or init cannot stall unit_list.

    def module(self, unit_id: str) -> types.ModuleType | None:
        loaded = self._loaded.get(unit_id)
        return loaded.module if loaded else None

    def is_loaded(self, unit_id: str) -> bool:
        return unit_id in self._loaded

    def loaded_units(self) -> list[str]:
        """The ids of the units loaded now, sorted."""
        return sorted(list(self._loaded))

    def load_error(self, unit_id: str) -> str | None:
        return self._load_errors.get(unit_id)

    def unit_logger(self, unit_id: str) -> logging.Logger:
        return logging.getLogger(f"units.{unit_id}")

    def unit_lock(self, unit_id: str) -> threading.RLock:
        with self._locks_lock:
            return self._unit_locks.setdefault(unit_id, threading.RLock())

    def use(self, unit_id: str) -> UnitUse:
        """A use of the unit's current module by the application, for `with` (threads) or `async with` (asyncio
        tasks; never the blocking `with` on an event loop). A reload of the unit waits for the uses in flight and
        holds new ones for its short window, so no call reaches a module half-way through a reload and no write
        made through a use is lost. `UnitNotLoaded` if the unit is not loaded."""
        return UnitUse(self, unit_id)

    def _gate(self, unit_id: str) -> Gate:
        gate = self._gates.get(unit_id)  # every request asks: no lock and no new gate once the unit has one
        if gate is not None:
            return gate
        with self._locks_lock:
            return self._gates.setdefault(unit_id, Gate())

    # -- activities -----------------------------------------------------------------------

    def register_activity(self, name: str, factory: Callable[[], Any]) -> None:
        """Called by a unit's init(host). The factory makes the activity's live session object."""
        with self._guard():
            self._activities.register(name, factory, self._initialising)
            if self._initialising is not None:
                self._pending_activities.append(name)

    def activities(self, unit_id: str | None = None) -> list[str]:
        return self._activities.names(unit_id)

    def activate(self, name: str) -> Any:
        """Make `name` the active activity; the previous one is deactivated first. Returns its session."""
        with self._guard():
            return self._activities.activate(name)

    def deactivate(self) -> None:
        with self._guard():
            self._activities.deactivate()

    @property
    def active_activity(self) -> str | None:
        return self._activities.active

    @property
    def active_session(self) -> Any:
        return self._activities.session

    # -- lifecycle ------------------------------------------------------------------------

    def snapshot(self, unit_id: str) -> tuple[bool, Any]:
        """(supported, state) from the unit's snapshot(), bounded by reload_timeout."""
        with self._guard():
            loaded = self._loaded.get(unit_id)
            fn = loaded.hook("snapshot") if loaded is not None else None
            if fn is None:
                return False, None
            return True, self._bounded(unit_id, lambda: "snapshot", fn)

    def keep_snapshot(self, unit_id: str, state_json: str) -> str | None:
        """Keep a captured state (JSON text) for `restore_snapshot`; its id, or None when it alone is over the
        budget. The oldest kept snapshots make room."""
        size = len(state_json.encode())
        if size > KEPT_SNAPSHOT_BYTES:
            return None
        snapshot_id = f"snap-{secrets.token_hex(6)}"
        with self._locks_lock:
            self._snapshots[snapshot_id] = (unit_id, state_json)
            self._snapshot_bytes += size
            while len(self._snapshots) > KEPT_SNAPSHOTS or self._snapshot_bytes > KEPT_SNAPSHOT_BYTES:
                _, (_, dropped) = self._snapshots.popitem(last=False)
                self._snapshot_bytes -= len(dropped.encode())
        return snapshot_id

    def kept_snapshot(self, unit_id: str, snapshot_id: str) -> str | None:
        """The JSON state of a snapshot `keep_snapshot` kept for this unit (None if it has no such one)."""
        kept = self._snapshots.get(snapshot_id)
        return kept[1] if kept is not None and kept[0] == unit_id else None

    def restore_snapshot(self, unit_id: str, state: Any) -> bool:
        """Hand `state` to the loaded unit's restore(), bounded by reload_timeout; False if it has none. If restore()
        fails, the state snapshot() gave just before is put back (best effort) and `RestoreError` says so.

        Like a reload, it waits for the uses in flight (up to `drain_timeout`, else `DrainTimeout` and nothing is
        restored) and holds new ones until it is done: a write made through a use is never overwritten half-way."""
        if (id(self), unit_id) in held_uses.get():
            raise DrainTimeout(f"restoring unit {unit_id} was asked for inside a use of it, which it would wait for")
        gate = self._gate(unit_id)
        with self.unit_lock(unit_id):
            try:
                if not gate.close(self.drain_timeout):
                    raise DrainTimeout(
                        f"uses of unit {unit_id} still running after {self.drain_timeout:g} s (drain timeout); "
                        "nothing was restored"
                    )
                return self._restore_snapshot(unit_id, state)
            finally:
                gate.open()

    def _restore_snapshot(self, unit_id: str, state: Any) -> bool:
        with self._guard():
            loaded = self._loaded.get(unit_id)
            restore = loaded.hook("restore") if loaded is not None else None
            if restore is None:
                return False
            snapshot = loaded.hook("snapshot") if loaded is not None else None
            before = self._bounded(unit_id, lambda: "snapshot", snapshot) if snapshot is not None else None
            try:
                self._bounded(unit_id, lambda: "restore", lambda: restore(state))
            except (Exception, SystemExit) as exc:
                rolled_back = False
                if snapshot is not None:
                    try:
                        self._bounded(unit_id, lambda: "restore", lambda: restore(before))
                        rolled_back = True
                    except (Exception, SystemExit):
                        self.logger.exception("putting back the state of unit %s failed", unit_id)
                raise RestoreError(exc, rolled_back) from exc
            self.logger.info("unit %s restored from a snapshot", unit_id)
            return True

    def unload(self, unit_id: str) -> None:
        """Drop the unit once its uses in flight finished (or `drain_timeout` passed); waiting uses then get
        `UnitNotLoaded`."""
        gate = self._gate(unit_id)
        with self.unit_lock(unit_id):
            if not gate.close(self.drain_timeout):
                self.logger.warning("unloading unit %s with uses still running after %g s", unit_id, self.drain_timeout)
            try:
                with self._guard():
                    loaded = self._loaded.pop(unit_id, None)
                    if loaded is not None:
                        self._teardown(loaded)
                    self._load_errors.pop(unit_id, None)
            finally:
                gate.open()
        self._unit_changed(unit_id)

    def _unit_changed(self, unit_id: str) -> None:
        for listener in self.unit_listeners:
            listener(unit_id)

    def reload(
        self, unit_id: str, *, rollback_source: Callable[[], bool] | None = None, state: Any = OWN_STATE
    ) -> Reloaded:
        """Prepare → quiesce → snapshot → migrate → drop → swap → init → restore → re-activate, as one transaction.

        The new version is imported into fresh modules first, while the old one serves; then new uses of the unit
        wait, the uses in flight finish (up to `drain_timeout`, else the reload is refused), and the short window
        runs with nothing of the unit in use. On failure the old modules, their init and their state are put back,
        and `rollback_source` (given when the reload follows a write) restores the old sources first; it returns
        False when it did not (someone else changed them meanwhile, and their change stays).
        The old version stays listed as loaded until the new one replaces it. `state`, when given, is what the new
        version's restore() gets instead of the old version's (a checkpoint's state, put back with its code); the old
        version's own state still goes back to it if the reload fails.
        """
        try:
            restored, evidence, timings = self._reload(unit_id, rollback_source, state)
        finally:
            self._unit_changed(unit_id)
        return Reloaded(unit_id, restored, evidence, *timings)

    def _reload(
        self, unit_id: str, rollback_source: Callable[[], bool] | None, given: Any = OWN_STATE
    ) -> tuple[bool, dict[str, Any], tuple[float, float, float]]:
        """The transaction behind `reload` (reloading.py): (state restored, activity evidence, (duration, blocked,
        window) in ms)."""
        return reloading.run(self, unit_id, rollback_source, given)

    def _bring_up(self, unit_id: str, progress: Progress) -> LoadedUnit:
        """import → init of a unit loaded at start; `progress` tells the caller how far it got if it fails or
        hangs."""
        progress.module = self._import(unit_id)
        if self._transaction_thread != threading.get_ident():
            raise ReloadTimeout("the import returned after the reload had given up on it; not initialised")
        progress.stage = "init"
        progress.loaded = self._init(unit_id, progress.module)
        progress.loaded.version = version_of(progress.module, progress.loaded.modules)
        return progress.loaded

    def _bounded(
        self,
        unit_id: str,
        stage: Callable[[], str],
        work: Callable[[], Any],
        *,
        progress: Progress | None = None,
        acting: bool = True,
    ) -> Any:
        """Run unit code on the reload worker thread and stop waiting after `reload_timeout` seconds (per stage the
        job `enter`s in `progress`, when given).

        A hung snapshot, drop, import, init or restore cannot be killed, but it no longer holds the
        host: the call fails with `ReloadTimeout` and the stuck worker is replaced. With `acting`, the caller
        holds the host lock and the worker acts as its holder meanwhile (unit code calls host methods from
        init); without, the job takes the lock itself (the reload's window), and leaves `_transaction_thread`,
        which only a holder of the lock may set, alone.
        """
        outcome: dict[str, Any] = {}
        abandoned = threading.Event()
        done = threading.Event()

        given_up: list[str] = []

        def run() -> None:
            if acting:
                self._transaction_thread = threading.get_ident()
            try:
                outcome["value"] = work()
            except BaseException as exc:
                outcome["error"] = exc
            finally:
                if abandoned.is_set():
                    with self._lock:
                        self._resync_modules(unit_id)
                    self.logger.warning(
                        "a timed-out %s of unit %s returned late; its result was discarded", given_up[0], unit_id
                    )
                done.set()

        if self._worker is None:
            self._worker = _Worker("unit-mcp-reload")
        self._worker.submit(run)
        finished = self._waited(done, progress)
        if acting:
            self._transaction_thread = None
        if not finished:
            given_up.append(stage())
            abandoned.set()
            self._worker.stop()
            self._worker = None
            if cancel.requested():
                raise ReloadTimeout(f"{given_up[0]} of unit {unit_id} was still running when the caller cancelled")
            raise ReloadTimeout(f"{given_up[0]} of unit {unit_id} did not finish within {self.reload_timeout:g} s")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def _waited(self, done: threading.Event, progress: Progress | None) -> bool:
        """Wait for a bounded job: False once its stage ran past `reload_timeout` or the caller cancelled (looked at
        every 0.1 s: the job moves from stage to stage, each with its own bound)."""
        if progress is None:
            return cancel.wait(done, self.reload_timeout)
        while not cancel.wait(
            done, max(0.0, min(0.1, progress.since + progress.extra + self.reload_timeout - time.monotonic()))
        ):
            if progress.committed:  # only the gate's opening is left: it ends in microseconds
                done.wait()
                return True
            if cancel.requested() and progress.abandon():
                return done.is_set()
            if progress.given_up(self.reload_timeout):
                return done.is_set()
        return True

    def _resync_modules(self, unit_id: str) -> None:
        """After an abandoned (timed-out) import finally returns, make sys.modules match what the host serves."""
        self._purge(unit_id)
        loaded = self._loaded.get(unit_id)
        if loaded is not None:
            install(loaded.modules)

    def _guard(self) -> Any:
        """The host lock, except in the reload worker, which runs while its caller holds that lock."""
        if self._transaction_thread is not None and threading.get_ident() == self._transaction_thread:
            return contextlib.nullcontext()
        return self._lock

    def _import(self, unit_id: str) -> types.ModuleType:
        self._purge(unit_id)
        self._pending_activities = []
        assert self._finder is not None
        return self._finder.load(self.module_name(unit_id))

    def _init(self, unit_id: str, module: types.ModuleType) -> LoadedUnit:
        lifecycle = lifecycle_of(module)  # as exported at import, before init can change it
        init = lifecycle.get("init")
        if init is not None:
            self._initialising = unit_id
            try:
                init(self)
            finally:
                self._initialising = None
        name = self.module_name(unit_id)
        if sys.modules.get(name) is not module:
            self.logger.warning("unit %s removed or replaced its module in sys.modules during init; put back", unit_id)
            sys.modules[name] = module
        return LoadedUnit(unit_id, module, self._unit_modules(unit_id), list(self._pending_activities), lifecycle)

    def _teardown(self, loaded: LoadedUnit, *, here: bool = False) -> None:
        """Deactivate the unit's activity, call drop() (bounded), unregister its activities, purge its modules.
        `here`: in the window's job on the reload worker, which bounds the drop stage and discards after it."""
        if self._activities.owned_by(loaded.unit_id):
            self.deactivate()
        drop = loaded.hook("drop")
        if drop is not None:
            try:
                if here:
                    drop()
                else:
                    self._bounded(loaded.unit_id, lambda: "drop", drop)
            except (Exception, SystemExit):
                self.logger.exception("drop() of unit %s failed", loaded.unit_id)
        if not here:
            self._discard(loaded.unit_id)

    def _discard(self, unit_id: str) -> None:
        """Forget the unit's activities and modules (after drop, or after a failed import or init)."""
        self._activities.forget(unit_id)
        self._purge(unit_id)

    def _unit_modules(self, unit_id: str) -> dict[str, types.ModuleType]:
        names = self._finder.names.get(unit_id, ()) if self._finder is not None else ()
        return {name: sys.modules[name] for name in sorted(names) if name in sys.modules}

    def _purge(self, unit_id: str) -> None:
        for key in self._unit_modules(unit_id):
            del sys.modules[key]

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, SyntaxError) and exc.lineno is not None:
            where = self.redact(exc.filename or "?")
            return f"SyntaxError: {exc.msg} ({where}, line {exc.lineno}, column {exc.offset})"
        return self.redact(f"{type(exc).__name__}: {exc}")

    def unit_traceback(self, unit_id: str, exc: BaseException) -> str:
        """The traceback of a failed step, the unit's own frames only (the others counted). Call it before the
        source is rolled back: a frame's line is read then, and must be the line that was attempted."""
        prefix = self.module_name(unit_id)
        frames = list(traceback.walk_tb(exc.__traceback__))
        own = [
            (frame, line)
            for frame, line in frames
            if (name := str(frame.f_globals.get("__name__", ""))) == prefix or name.startswith(prefix + ".")
        ]
        others = len(frames) - len(own)
        head = f"Traceback (most recent call last; unit {unit_id}'s frames"
        head += f", {others} frame{'s' if others != 1 else ''} of the host and importlib not shown):\n"
        lines = [head, *traceback.StackSummary.extract(own).format(), *traceback.format_exception_only(exc)]
        return self.redact("".join(lines))[-4000:]

    def _failure(
        self,
        unit_id: str,
        stage: str,
        exc: BaseException,
        *,
        rolled_back: bool,
        source_restored: bool,
        trace: str | None = None,
        first: bool = False,
    ) -> ReloadError:
        """Record and log a failed load (`first`: the unit had no version serving before) or reload."""
        text = self._describe(exc)
        evidence = {
            "unit_id": unit_id,
            "reloaded": False,
            "stage": stage,
            "error": text,
            "traceback": trace if trace is not None else self.unit_traceback(unit_id, exc),
            "rolled_back": rolled_back,
            "source_restored": source_restored,
            "previous_version_serving": unit_id in self._loaded,
            "active_activity_after": self.active_activity,
        }
        self.logger.error("%s unit %s failed at %s: %s", "loading" if first else "reloading", unit_id, stage, text)
        return ReloadError(unit_id, stage, text, evidence)

    def remember_code(self, origin: str, data: bytes, code: types.CodeType) -> None:
        """Code compiled from `data` for the source named `origin`, for the next import of exactly those bytes."""
        if self._finder is not None:
            self._finder.remember(origin, data, code)

    # -- the change log -------------------------------------------------------------------

    @property
    def changes(self) -> ChangeLog:
        """The change log, opened on first use: the loader's (in its database) if it keeps one, else `changes.db` in
        the data dir."""
        with self._changes_lock:
            if self._changes is None:
                changes = self.loader.change_log(self.change_retention)
                if changes is None:
                    self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                    changes = SqliteChangeLog(self.data_dir / "changes.db", self.change_retention, private=True)
                self._changes = changes
            return self._changes

    def _record_outside(self, unit_id: str, source_ids: Collection[str], error: str | None) -> None:
        """Record the sources someone changed outside the tools with their bytes now (None: gone); one too large to
        keep is left out."""
        kind = self.unit_kind(unit_id)
        found: list[tuple[str, bytes | None]] = []
        for source_id in sorted(source_ids):
            data = None
            if kind is not None:
                try:
                    data = self.loader.read(Source(unit_id, kind, source_id), max_bytes=self.max_change_bytes)
                except SourceTooLarge:
                    continue
                except (LoaderError, OSError):
                    data = None
            found.append((source_id, data))
        self.changes.record_outside(unit_id, found, error, self.outside_caller(unit_id))

    # -- watching -------------------------------------------------------------------------

    def start_watching(self, *, debounce_ms: int = 300) -> None:
        """Reload units whose sources someone else changes in the store (a human's editor, another server)."""
        with self._guard():
            if self._watcher is None:
                self._watcher = self.loader.watch(self, debounce_ms=debounce_ms)

    def reload_changed(self, unit_id: str, sources: Collection[str] = ()) -> str | None:
        """A change made outside this host: load or reload the unit, or unload it if it is gone. A failed reload
        keeps the old version running and is logged (its error returned); the changed source is never touched.
        `sources` (the ids someone other than a unit tool changed) go to the change log."""
        with self.unit_lock(unit_id):
            error = None
            if self.unit_kind(unit_id) is None:
                if self.is_loaded(unit_id):
                    self.unload(unit_id)
                    self.logger.info("unit %s removed from the store: unloaded", unit_id)
            else:
                try:
                    self.reload(unit_id)
                    self.logger.info("unit %s reloaded after a change in the store", unit_id)
                except ReloadError as exc:
                    error = exc.error
                    self.logger.error("change of unit %s not loaded (%s); previous version kept", unit_id, exc.error)
            if sources:
                try:
                    self._record_outside(unit_id, sources, error)
                except Exception:
                    self.logger.exception("recording the outside change of unit %s in the change log failed", unit_id)
            return error

    def stop_watching(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.stop()
