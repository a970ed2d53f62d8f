"""The headless engine: the units of one loader, their activities, transactional reload and the app log."""

from __future__ import annotations

import contextlib
import contextvars
import gc
import hashlib
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import applog, cancel, paths
from .activities import Activities
from .changelog import DEFAULT_RETENTION, NOBODY, Caller, ChangeLog, Retention, SqliteChangeLog
from .importer import BytecodeCache, UnitFinder
from .loader import Loader, LoaderError, Source, SourceTooLarge, UnitKind, Watch, is_loader
from .redact import Redactor
from .units import open_loader

if TYPE_CHECKING:
    import asyncio  # imported where a use waits in a task: it pulls in subprocess, which a test run does without

    from .githistory import GitMode

LIFECYCLE = ("init", "drop", "snapshot", "restore")
HOOKS = (*LIFECYCLE, "migrate")
"""The lifecycle exports and `migrate(state, from_version)`, called when a reload changes the unit's version."""
OWN_STATE: Any = object()
"""`Host.reload`'s default `state`: the new version restores the state the old one hands over."""
KEPT_SNAPSHOTS = 64
KEPT_SNAPSHOT_BYTES = 64 * 1024 * 1024
"""Captured snapshots kept in memory for `restore_snapshot`: the newest 64, at most 64 MiB of JSON in all."""
_claimed_namespaces: dict[str, Host] = {}
_claim_lock = threading.Lock()


@dataclass(frozen=True)
class Reloaded:
    """What a reload did, as plain data (the service turns it into the tools' result; pydantic stays out of the
    test host process, whose start-up it would double)."""

    unit_id: str
    restored_state: bool
    """snapshot() state was handed to restore()."""
    activity: dict[str, Any]
    """The `ActivityEvidence` fields: the activity active before and after, whether it was re-activated."""
    duration_ms: float
    blocked_ms: float = 0.0
    """How long new uses of the unit waited: the drain of the uses in flight plus the window."""
    window_ms: float = 0.0
    """The window itself (snapshot, migrate, drop, swap, init, restore), with nothing of the unit running."""


class UnitNotLoaded(LookupError):
    """A use of a unit that is not loaded (never loaded, failed to load, or unloaded)."""

    def __init__(self, unit_id: str) -> None:
        super().__init__(f"unit {unit_id!r} is not loaded")
        self.unit_id = unit_id


_held: contextvars.ContextVar[frozenset[tuple[int, str]]] = contextvars.ContextVar("unit_mcp_uses", default=frozenset())
"""(host id, unit id) of the uses the current thread or task holds: a nested use never waits for a reload that is
itself waiting for the outer use to finish."""


class _Gate:
    """The uses of one unit in flight, and whether a reload has closed the unit to new ones (they wait, threads on
    the condition, asyncio tasks on a future woken from the reloading thread)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self.active = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def enter(self, nested: bool) -> None:
        with self._cond:
            while self._closed and not nested:
                self._cond.wait()
            self.active += 1

    def enter_or_wait(self, nested: bool) -> asyncio.Future[None] | None:
        """Enter now (None), or a future of the running loop that is done when the gate opens again."""
        with self._cond:
            if not self._closed or nested:
                self.active += 1
                return None
            import asyncio

            loop = asyncio.get_running_loop()
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, future))
            return future

    def leave(self) -> None:
        with self._cond:
            self.active -= 1
            if self.active == 0:
                self._cond.notify_all()

    def close(self, timeout: float) -> bool:
        """Hold new uses and wait for those in flight to finish; False if some still run after `timeout` seconds
        (the gate stays closed: the caller opens it)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closed = True
            while self.active:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def open(self) -> None:
        with self._cond:
            self._closed = False
            self._cond.notify_all()
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # a loop closed meanwhile has nobody left to wake
                loop.call_soon_threadsafe(_wake, future)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


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
        return self._key in _held.get()

    def _admitted(self) -> types.ModuleType:
        self._entered = True
        loaded = self._host._loaded.get(self.unit_id)
        if loaded is None:
            self.release()
            raise UnitNotLoaded(self.unit_id)
        self._token = _held.set(_held.get() | {self._key})
        self.module = loaded.module
        return loaded.module

    def release(self) -> None:
        """Let a waiting reload go on (idempotent); the module stays what this use got. A use made after this, in
        the same thread or task, is a use of its own that waits for a reload's window like any other."""
        if self._entered:
            self._entered = False
            self._gate.leave()
            held = _held.get()
            if self._key in held:
                _held.set(held - {self._key})

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
                _held.reset(token)


class ReloadError(Exception):
    """A reload step failed; the previous version (if any) was put back. `evidence` says what happened."""

    def __init__(self, unit_id: str, stage: str, error: str, evidence: dict[str, Any]) -> None:
        super().__init__(f"{unit_id}: {stage} failed: {error}")
        self.unit_id = unit_id
        self.stage = stage
        self.error = error
        self.evidence = evidence


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


class ReloadTimeout(Exception):
    """Unit code (import, init or restore) ran past the host's reload timeout."""


class DrainTimeout(Exception):
    """Uses of the unit were still running after the host's drain timeout: the reload was refused."""


@dataclass
class LoadedUnit:
    unit_id: str
    module: types.ModuleType
    modules: dict[str, types.ModuleType]
    activities: list[str] = field(default_factory=list)
    lifecycle: dict[str, Callable[..., Any]] = field(default_factory=dict)
    version: Any = None
    """The unit's `VERSION` if it declares one, else the hash of its module sources."""

    def hook(self, name: str) -> Callable[..., Any] | None:
        """The lifecycle function as exported at import (a unit deleting its own later cannot lose its state)."""
        return self.lifecycle.get(name)


def _lifecycle(module: types.ModuleType) -> dict[str, Callable[..., Any]]:
    return {name: fn for name in HOOKS if callable(fn := getattr(module, name, None))}


def _version(module: types.ModuleType, modules: dict[str, types.ModuleType]) -> Any:
    """`VERSION` as the unit declares it, else the `sha256:` hash of its source (of its module sources in name
    order, for a unit of several modules)."""
    declared = getattr(module, "VERSION", None)
    if declared is not None:
        return declared
    datas = [getattr(getattr(m.__spec__, "loader", None), "data", b"") for _, m in sorted(modules.items())]
    if len(datas) == 1:
        return paths.hash_bytes(datas[0])
    digest = hashlib.sha256()
    for name, data in zip(sorted(modules), datas, strict=True):
        digest.update(f"{name}\0{paths.hash_bytes(data)}\n".encode())
    return f"sha256:{digest.hexdigest()}"


def _install(modules: dict[str, types.ModuleType]) -> None:
    """Put modules in sys.modules, each bound to its package as an import binds it (`units.counter.panel`)."""
    for name, module in sorted(modules.items()):
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, module)


@dataclass
class _Prepared:
    """A new version imported into fresh module objects, none of them in sys.modules or served yet."""

    module: types.ModuleType
    modules: dict[str, types.ModuleType]
    version: Any


class _GivenUp(Exception):
    """Raised in a job the caller stopped waiting for, before its next stage: nothing more of it runs."""


@dataclass
class _Progress:
    """How far a bounded job got. A job of several stages (the window) calls `enter` for each: every stage gets
    its own `reload_timeout`, and a job given up on stops before its next stage."""

    stage: str = "import"
    module: types.ModuleType | None = None
    loaded: LoadedUnit | None = None
    since: float = field(default_factory=time.monotonic)
    abandoned: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self, stage: str) -> None:
        with self.lock:
            if self.abandoned:
                raise _GivenUp(stage)
            self.stage = stage
            self.since = time.monotonic()

    def given_up(self, timeout: float) -> bool:
        """Whether the current stage ran past `timeout` (then the job is marked abandoned)."""
        with self.lock:
            if time.monotonic() - self.since < timeout:
                return False
            self.abandoned = True
            return True


@dataclass
class _Handed:
    """The old version's state on its way to the new one (snapshot, then migrate); `given`, when not `OWN_STATE`, is
    what the new version restores instead (a checkpoint's state), the old state kept for a failure."""

    given: Any = OWN_STATE
    state: Any = None
    has_state: bool = False

    def for_new(self) -> tuple[Any, bool]:
        """The state the new version's restore() gets, and whether there is one."""
        return (self.state, self.has_state) if self.given is OWN_STATE else (self.given, True)


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
        self._lock = threading.RLock()
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
        self._gates: dict[str, _Gate] = {}
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
            discovered = self.loader.discover() if unit_ids is None else None
            ids = list(discovered if discovered is not None else unit_ids or ())
            assert self._finder is not None
            self._finder.kinds = discovered  # a lookup per unit less while starting
            # A store whose reads are round trips gives every source at once: a query per source less.
            self._finder.prefetched = self.loader.read_python_sources() if discovered is not None else None
            # A full start reuses the code compiled at the last one (a partial start, like the test host's, would
            # read the whole cache for one unit, and must not shrink it).
            cache = None if discovered is None else paths.private_dir(self.data_dir, "bytecode") / "units"
            bytecode = None if cache is None else BytecodeCache(cache).load()
            self._finder.bytecode = bytecode
            # No cyclic GC while loading: each full collection walks every module loaded so far, and with
            # thousands of units they were a third of the start's CPU time.
            collecting = gc.isenabled()
            gc.disable()
            try:
                pending = ids
                while pending:
                    pending = self._bring_up_batch(pending)
            finally:
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
        marker: list[Any] = [0, time.perf_counter(), _Progress()]
        abandoned = threading.Event()
        done = threading.Event()
        escaped: list[BaseException] = []

        def run() -> None:
            self._transaction_thread = threading.get_ident()
            try:
                for index, unit_id in enumerate(unit_ids):
                    if abandoned.is_set():
                        return
                    progress = _Progress()
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

    def _gate(self, unit_id: str) -> _Gate:
        with self._locks_lock:
            return self._gates.setdefault(unit_id, _Gate())

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
        if (id(self), unit_id) in _held.get():
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
        """The transaction behind `reload`: (state restored, activity evidence, (duration, blocked, window) in ms)."""
        started = time.perf_counter()
        if (id(self), unit_id) in _held.get():
            inside = RuntimeError(f"reload of unit {unit_id} asked for inside a use of it, which it would wait for")
            with self._guard():  # not the unit lock: a reload waiting for this very use may hold it
                raise self._refuse(unit_id, "drain", inside, self._loaded.get(unit_id), rollback_source)
        with self.unit_lock(unit_id):
            with self._guard():
                old = self._loaded.get(unit_id)
                progress = _Progress()
                try:
                    prepared = self._bounded(unit_id, lambda: progress.stage, lambda: self._prepare(unit_id))
                except (Exception, SystemExit) as exc:
                    raise self._refuse(unit_id, "import", exc, old, rollback_source) from exc
            gate = self._gate(unit_id)
            closed = time.perf_counter()
            try:
                if not gate.close(self.drain_timeout):
                    drained = DrainTimeout(
                        f"uses of unit {unit_id} still running after {self.drain_timeout:g} s (drain timeout); "
                        "reload refused, the previous version serves on"
                    )
                    with self._guard():
                        raise self._refuse(unit_id, "drain", drained, old, rollback_source)
                window = time.perf_counter()
                with self._guard():
                    restored, evidence = self._swap(unit_id, old, prepared, rollback_source, given)
            finally:
                gate.open()
                opened = time.perf_counter()
        duration = (opened - started) * 1000
        blocked, in_window = (opened - closed) * 1000, (opened - window) * 1000
        self.logger.info(
            "unit %s reloaded in %.1f ms (uses held %.2f ms, window %.2f ms)", unit_id, duration, blocked, in_window
        )
        return restored, evidence, (duration, blocked, in_window)

    def _refuse(
        self,
        unit_id: str,
        stage: str,
        exc: BaseException,
        old: LoadedUnit | None,
        rollback_source: Callable[[], bool] | None,
    ) -> ReloadError:
        """A reload given up before anything of the old version was touched: it serves on (a unit loaded for the
        first time is recorded as failed)."""
        trace = self.unit_traceback(unit_id, exc)  # before the rollback: the lines shown are the ones attempted
        source_restored = self._roll_back_source(unit_id, rollback_source)
        if old is None:
            self._load_errors[unit_id] = self._describe(exc)
        return self._failure(
            unit_id,
            stage,
            exc,
            rolled_back=old is not None,
            source_restored=source_restored,
            trace=trace,
            first=old is None,
        )

    def _prepare(self, unit_id: str) -> _Prepared:
        """Read, compile and import the unit's new version into fresh modules, then put back in sys.modules what
        serves now: nothing of the new version is visible until the swap."""
        serving = self._unit_modules(unit_id)
        self._purge(unit_id)
        modules: dict[str, types.ModuleType] = {}
        try:
            module = importlib.import_module(self.module_name(unit_id))
            modules = self._unit_modules(unit_id)
        finally:
            self._purge(unit_id)
            for name, new in modules.items():  # an import binds a module to its package: unbind what it bound
                parent, _, child = name.rpartition(".")
                if getattr(sys.modules.get(parent), child, None) is new:
                    delattr(sys.modules[parent], child)
            _install(serving)
        if self._transaction_thread != threading.get_ident():
            raise ReloadTimeout("the import returned after the reload had given up on it; discarded")
        return _Prepared(module, modules, _version(module, modules))

    def _swap(
        self,
        unit_id: str,
        old: LoadedUnit | None,
        prepared: _Prepared,
        rollback_source: Callable[[], bool] | None,
        given: Any = OWN_STATE,
    ) -> tuple[bool, dict[str, Any]]:
        """The window, with no use of the unit running: snapshot → migrate → drop → swap → init → restore, as one
        job on the reload worker (a hand-over between threads per stage cost more than the stages themselves on a
        busy process: each waits for the GIL), each stage still bounded by `reload_timeout` on its own."""
        active_before = self.active_activity
        owned_active = self._activities.owned_by(unit_id)
        progress = _Progress(stage="snapshot", module=prepared.module)
        handed = _Handed(given)
        try:
            new, restored = self._bounded(
                unit_id,
                lambda: progress.stage,
                lambda: self._window(unit_id, old, prepared, handed, progress),
                progress=progress,
            )
        except (Exception, SystemExit) as exc:
            if progress.stage in ("snapshot", "migrate"):
                raise self._refuse(unit_id, progress.stage, exc, old, rollback_source) from exc
            if progress.stage != "drop":
                raise self._failed_window(
                    unit_id, old, handed, progress, exc, rollback_source, active_before if owned_active else None
                ) from exc
            # drop() hung: given up on as a failing drop is (logged), and the new version comes in on a new worker
            self.logger.error("drop() of unit %s failed: %s", unit_id, self._describe(exc))
            self._discard(unit_id)
            progress = _Progress(stage="init", module=prepared.module)
            try:
                new, restored = self._bounded(
                    unit_id,
                    lambda: progress.stage,
                    lambda: self._bring_in(unit_id, prepared, *handed.for_new(), progress),
                )
            except (Exception, SystemExit) as late:
                raise self._failed_window(
                    unit_id, old, handed, progress, late, rollback_source, active_before if owned_active else None
                ) from late
        self._loaded[unit_id] = new
        self._load_errors.pop(unit_id, None)
        return restored, self._activities.reactivate(unit_id, active_before, owned_active, self._describe)

    def _window(
        self, unit_id: str, old: LoadedUnit | None, prepared: _Prepared, handed: _Handed, progress: _Progress
    ) -> tuple[LoadedUnit, bool]:
        """The window's stages in the reload worker; `progress` says which one failed or hangs."""
        if old is not None:
            snapshot = old.hook("snapshot")
            if snapshot is not None:
                handed.has_state = True
                own = handed.given is OWN_STATE  # else the old state is only kept for a failure: not migrated
                handed.state = self._handed_over(old, prepared, snapshot, progress) if own else snapshot()
            elif callable(prepared.module.__dict__.get("migrate")) and old.version != prepared.version:
                self.logger.info("unit %s has migrate() but its previous version had no snapshot(): not run", unit_id)
            progress.enter("drop")
            self._teardown(old, here=True)
        progress.enter("init")
        if old is not None:
            self._discard(unit_id)
        return self._bring_in(unit_id, prepared, *handed.for_new(), progress)

    def _failed_window(
        self,
        unit_id: str,
        old: LoadedUnit | None,
        handed: _Handed,
        progress: _Progress,
        exc: BaseException,
        rollback_source: Callable[[], bool] | None,
        reactivate: str | None,
    ) -> ReloadError:
        """init or restore of the new version failed: it goes, the old version comes back with its state."""
        trace = self.unit_traceback(unit_id, exc)
        if progress.loaded is not None:
            self._teardown(progress.loaded)
        else:
            self._discard(unit_id)
        source_restored = self._roll_back_source(unit_id, rollback_source)
        reinstated = old is not None and self._reinstate(old, handed.state, handed.has_state, reactivate)
        if not reinstated:
            self._loaded.pop(unit_id, None)
            self._load_errors[unit_id] = self._describe(exc)
        return self._failure(
            unit_id,
            progress.stage,
            exc,
            rolled_back=reinstated,
            source_restored=source_restored,
            trace=trace,
            first=old is None,
        )

    def _handed_over(
        self, old: LoadedUnit, prepared: _Prepared, snapshot: Callable[[], Any], progress: _Progress
    ) -> Any:
        """The old version's state as the new version takes it: snapshot(), then the new version's
        migrate(state, from_version) when the version changed."""
        state = snapshot()
        migrate = prepared.module.__dict__.get("migrate")
        if callable(migrate) and old.version != prepared.version:
            progress.stage = "migrate"
            state = migrate(state, old.version)
        return state

    def _bring_in(
        self, unit_id: str, prepared: _Prepared, state: Any, has_state: bool, progress: _Progress
    ) -> tuple[LoadedUnit, bool]:
        """swap → init → restore (the old version is torn down already)."""
        _install(prepared.modules)
        self._pending_activities = []
        progress.loaded = self._init(unit_id, prepared.module)
        progress.loaded.version = prepared.version
        progress.stage = "restore"
        restore = progress.loaded.hook("restore")
        if has_state and restore is not None:
            restore(state)
            return progress.loaded, True
        return progress.loaded, False

    def _roll_back_source(self, unit_id: str, rollback_source: Callable[[], bool] | None) -> bool:
        if rollback_source is None:
            return False
        try:
            return rollback_source()
        except Exception:
            self.logger.exception("restoring the previous source of unit %s failed", unit_id)
            return False

    def _bring_up(self, unit_id: str, progress: _Progress) -> LoadedUnit:
        """import → init of a unit loaded at start; `progress` tells the caller how far it got if it fails or
        hangs."""
        progress.module = self._import(unit_id)
        if self._transaction_thread != threading.get_ident():
            raise ReloadTimeout("the import returned after the reload had given up on it; not initialised")
        progress.stage = "init"
        progress.loaded = self._init(unit_id, progress.module)
        progress.loaded.version = _version(progress.module, progress.loaded.modules)
        return progress.loaded

    def _bounded(
        self,
        unit_id: str,
        stage: Callable[[], str],
        work: Callable[[], Any],
        *,
        progress: _Progress | None = None,
    ) -> Any:
        """Run unit code on the reload worker thread and stop waiting after `reload_timeout` seconds (per stage the
        job `enter`s in `progress`, when given).

        A hung snapshot, drop, import, init or restore cannot be killed, but it no longer holds the
        host: the call fails with `ReloadTimeout` and the stuck worker is replaced. The worker acts
        as the host's lock holder meanwhile (unit code calls host methods from init).
        """
        outcome: dict[str, Any] = {}
        abandoned = threading.Event()
        done = threading.Event()

        given_up: list[str] = []

        def run() -> None:
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

    def _waited(self, done: threading.Event, progress: _Progress | None) -> bool:
        """Wait for a bounded job: False once its stage ran past `reload_timeout` or the caller cancelled."""
        if progress is None:
            return cancel.wait(done, self.reload_timeout)
        while not cancel.wait(done, max(0.0, progress.since + self.reload_timeout - time.monotonic())):
            if cancel.requested():
                with progress.lock:
                    progress.abandoned = True
                return done.is_set()
            if progress.given_up(self.reload_timeout):
                return done.is_set()
        return True

    def _resync_modules(self, unit_id: str) -> None:
        """After an abandoned (timed-out) import finally returns, make sys.modules match what the host serves."""
        self._purge(unit_id)
        loaded = self._loaded.get(unit_id)
        if loaded is not None:
            _install(loaded.modules)

    def _guard(self) -> Any:
        """The host lock, except in the reload worker, which runs while its caller holds that lock."""
        if self._transaction_thread is not None and threading.get_ident() == self._transaction_thread:
            return contextlib.nullcontext()
        return self._lock

    def _import(self, unit_id: str) -> types.ModuleType:
        self._purge(unit_id)
        self._pending_activities = []
        return importlib.import_module(self.module_name(unit_id))

    def _init(self, unit_id: str, module: types.ModuleType) -> LoadedUnit:
        lifecycle = _lifecycle(module)  # as exported at import, before init can change it
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

    def _reinstate(self, old: LoadedUnit, state: Any, has_state: bool, reactivate: str | None) -> bool:
        """Put the previous module objects back and bring them up again with their state."""
        _install(old.modules)
        self._pending_activities = []
        try:
            init = old.hook("init")
            if init is not None:
                self._initialising = old.unit_id
                try:
                    init(self)
                finally:
                    self._initialising = None
            restore = old.hook("restore")
            if has_state and restore is not None:
                restore(state)
        except Exception as exc:
            self.logger.exception("putting back the previous version of unit %s failed", old.unit_id)
            self._discard(old.unit_id)
            self._load_errors[old.unit_id] = self._describe(exc)
            return False
        old.activities = list(self._pending_activities)
        self._loaded[old.unit_id] = old
        if reactivate is not None and reactivate in self._activities:
            try:
                self.activate(reactivate)
            except Exception:
                self.logger.exception("re-activating %s after a rollback failed", reactivate)
        return True

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
