"""The reload transaction of one unit, below the host that runs it: prepare → quiesce → window → reopen.

The new version is imported into fresh modules while the old one serves (prepare); then the unit's gate closes to
new uses and the uses in flight finish (quiesce); the window (snapshot → migrate → drop → swap → init → restore)
runs with nothing of the unit in use, as one job of the host's reload worker that also closed the gate and opens
it again: no thread waits for another to be woken in between. What the transaction hands around (`Progress`,
`Handed`, `Prepared`, `LoadedUnit`) and what it raises live here too; `Engine` is what it needs of the host.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import importlib
import logging
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from . import paths

if TYPE_CHECKING:
    import asyncio  # imported where a use waits in a task: it pulls in subprocess, which a test run does without

    from .activities import Activities

LIFECYCLE = ("init", "drop", "snapshot", "restore")
HOOKS = (*LIFECYCLE, "migrate")
"""The lifecycle exports and `migrate(state, from_version)`, called when a reload changes the unit's version."""
OWN_STATE: Any = object()
"""`Host.reload`'s default `state`: the new version restores the state the old one hands over."""

QUICK_SWITCH_S = 0.0002
"""The GIL switch interval while a reload holds a unit's uses (Python's default is 5 ms): each thread woken to go on
with it (the reload worker, the reloading caller) gets the GIL within this instead of waiting out another thread's
5 ms turn, which was most of a window's time on a busy process."""

_quick_lock = threading.Lock()
_quick_holders: list[Any] = [0, None]
"""How many reloads hold uses now, and the switch interval to put back after the last."""


@contextlib.contextmanager
def quick_switches() -> Iterator[None]:
    with _quick_lock:
        if _quick_holders[0] == 0:
            _quick_holders[1] = sys.getswitchinterval()
            sys.setswitchinterval(min(QUICK_SWITCH_S, _quick_holders[1]))
        _quick_holders[0] += 1
    try:
        yield
    finally:
        with _quick_lock:
            _quick_holders[0] -= 1
            if _quick_holders[0] == 0:
                sys.setswitchinterval(_quick_holders[1])


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


class HostLock:
    """The host's re-entrant lock, which a reload can take back from a reload worker it gave up on while the worker
    held it (hung in a unit's code in the window): the worker's late release is then a no-op."""

    def __init__(self) -> None:
        self._held = threading.Lock()
        self._state = threading.Lock()
        self._owner: int | None = None
        self._count = 0

    def acquire(self, blocking: bool = True) -> bool:
        me = threading.get_ident()
        with self._state:
            if self._owner == me:
                self._count += 1
                return True
        if not self._held.acquire(blocking):
            return False
        with self._state:
            self._owner, self._count = me, 1
        return True

    def release(self) -> None:
        with self._state:
            if self._owner != threading.get_ident():
                return  # taken back from this thread: no longer its to release
            self._count -= 1
            if self._count:
                return
            self._owner = None
        self._held.release()

    def take_back(self, holder: int | None) -> bool:
        """Make the calling thread the owner (once) if `holder` owns the lock now; False if it does not."""
        with self._state:
            if holder is None or self._owner != holder:
                return False
            self._owner, self._count = threading.get_ident(), 1
            return True

    def __enter__(self) -> HostLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


held_uses: contextvars.ContextVar[frozenset[tuple[int, str]]] = contextvars.ContextVar(
    "unit_mcp_uses", default=frozenset()
)
"""(host id, unit id) of the uses the current thread or task holds: a nested use never waits for a reload that is
itself waiting for the outer use to finish."""


class Gate:
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


class ReloadError(Exception):
    """A reload step failed; the previous version (if any) was put back. `evidence` says what happened."""

    def __init__(self, unit_id: str, stage: str, error: str, evidence: dict[str, Any]) -> None:
        super().__init__(f"{unit_id}: {stage} failed: {error}")
        self.unit_id = unit_id
        self.stage = stage
        self.error = error
        self.evidence = evidence


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


def lifecycle_of(module: types.ModuleType) -> dict[str, Callable[..., Any]]:
    return {name: fn for name in HOOKS if callable(fn := getattr(module, name, None))}


def version_of(module: types.ModuleType, modules: dict[str, types.ModuleType]) -> Any:
    """`VERSION` as the unit declares it, else the `sha256:` hash of its source (of its module sources in name
    order, for a unit of several modules)."""
    declared = getattr(module, "VERSION", None)
    if declared is not None:
        return declared
    hashes = [_source_hash(m) for _, m in sorted(modules.items())]
    if len(hashes) == 1:
        return hashes[0]
    digest = hashlib.sha256()
    for name, source_hash in zip(sorted(modules), hashes, strict=True):
        digest.update(f"{name}\0{source_hash}\n".encode())
    return f"sha256:{digest.hexdigest()}"


def _source_hash(module: types.ModuleType) -> str:
    """The hash of a unit module's source, as its loader took it at import (else hashed here)."""
    loader = getattr(module.__spec__, "loader", None)
    return getattr(loader, "digest", None) or paths.hash_bytes(getattr(loader, "data", b""))


def install(modules: dict[str, types.ModuleType]) -> None:
    """Put modules in sys.modules, each bound to its package as an import binds it (`units.counter.panel`)."""
    for name, module in sorted(modules.items()):
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, module)


@dataclass
class Prepared:
    """A new version imported into fresh module objects, none of them in sys.modules or served yet."""

    module: types.ModuleType
    modules: dict[str, types.ModuleType]
    version: Any


class Contended(Exception):
    """The window's job found the host lock held by another host operation: its caller takes the lock and runs the
    window again as a job under it (the unit stays drained and closed meanwhile)."""


class GivenUp(Exception):
    """Raised in a job the caller stopped waiting for, before its next stage: nothing more of it runs."""


@dataclass
class Progress:
    """How far a bounded job got. A job of several stages (the window) calls `enter` for each: every stage gets
    its own `reload_timeout`, and a job given up on stops before its next stage."""

    stage: str = "import"
    module: types.ModuleType | None = None
    loaded: LoadedUnit | None = None
    since: float = field(default_factory=time.monotonic)
    extra: float = 0.0
    """Seconds the current stage gets beyond `reload_timeout` (the drain: the drain timeout)."""
    holder: int | None = None
    """The worker thread, once it holds the host lock for the window."""
    abandoned: bool = False
    committed: bool = False
    """The job put the new version in service: from then on it is never given up on (it only opens the gate)."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self, stage: str) -> None:
        with self.lock:
            if self.abandoned:
                raise GivenUp(stage)
            self.stage = stage
            self.since = time.monotonic()
            self.extra = 0.0

    def commit(self) -> None:
        """The job's point of no return, unless it was given up on already (`GivenUp`)."""
        with self.lock:
            if self.abandoned:
                raise GivenUp(self.stage)
            self.committed = True

    def abandon(self) -> bool:
        """Give the job up (the caller cancelled); False once it committed."""
        with self.lock:
            self.abandoned = not self.committed
            return self.abandoned

    def given_up(self, timeout: float) -> bool:
        """Whether the current stage ran past `timeout` (then the job is marked abandoned)."""
        with self.lock:
            if self.committed or time.monotonic() - self.since < timeout + self.extra:
                return False
            self.abandoned = True
            return True


@dataclass
class Handed:
    """The old version's state on its way to the new one (snapshot, then migrate); `given`, when not `OWN_STATE`, is
    what the new version restores instead (a checkpoint's state), the old state kept for a failure."""

    given: Any = OWN_STATE
    state: Any = None
    has_state: bool = False

    def for_new(self) -> tuple[Any, bool]:
        """The state the new version's restore() gets, and whether there is one."""
        return (self.state, self.has_state) if self.given is OWN_STATE else (self.given, True)


class Engine(Protocol):
    """What the transaction uses of the host (`unit_mcp.host.Host`): its registries, its lock and reload worker,
    and the unit steps it shares with loading and unloading."""

    logger: logging.Logger
    drain_timeout: float
    _lock: HostLock
    _loaded: dict[str, LoadedUnit]
    _load_errors: dict[str, str]
    _activities: Activities
    _pending_activities: list[str]
    _initialising: str | None
    _transaction_thread: int | None

    @property
    def active_activity(self) -> str | None: ...

    def module_name(self, unit_id: str) -> str: ...

    def unit_lock(self, unit_id: str) -> threading.RLock: ...

    def unit_traceback(self, unit_id: str, exc: BaseException) -> str: ...

    def activate(self, name: str) -> Any: ...

    def _gate(self, unit_id: str) -> Gate: ...

    def _guard(self) -> Any: ...

    def _bounded(
        self,
        unit_id: str,
        stage: Callable[[], str],
        work: Callable[[], Any],
        *,
        progress: Progress | None = None,
        acting: bool = True,
    ) -> Any: ...

    def _init(self, unit_id: str, module: types.ModuleType) -> LoadedUnit: ...

    def _teardown(self, loaded: LoadedUnit, *, here: bool = False) -> None: ...

    def _discard(self, unit_id: str) -> None: ...

    def _unit_modules(self, unit_id: str) -> dict[str, types.ModuleType]: ...

    def _purge(self, unit_id: str) -> None: ...

    def _describe(self, exc: BaseException) -> str: ...

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
    ) -> ReloadError: ...


def run(
    host: Engine, unit_id: str, rollback_source: Callable[[], bool] | None, given: Any = OWN_STATE
) -> tuple[bool, dict[str, Any], tuple[float, float, float]]:
    """The transaction behind `reload`: (state restored, activity evidence, (duration, blocked, window) in ms)."""
    started = time.perf_counter()
    if (id(host), unit_id) in held_uses.get():
        inside = RuntimeError(f"reload of unit {unit_id} asked for inside a use of it, which it would wait for")
        with host._guard():  # not the unit lock: a reload waiting for this very use may hold it
            raise _refuse(host, unit_id, "drain", inside, host._loaded.get(unit_id), rollback_source)
    with host.unit_lock(unit_id):
        with host._guard():
            old = host._loaded.get(unit_id)
            progress = Progress()
            try:
                prepared = host._bounded(unit_id, lambda: progress.stage, lambda: _prepare(host, unit_id))
            except (Exception, SystemExit) as exc:
                raise _refuse(host, unit_id, "import", exc, old, rollback_source) from exc
        gate = host._gate(unit_id)
        times: dict[str, float] = {}

        def reopen() -> None:
            gate.open()
            times["opened"] = time.perf_counter()

        try:
            restored, evidence = _swap(host, unit_id, old, prepared, rollback_source, given, gate, times, reopen)
        finally:
            if "opened" not in times:  # the window's job did not get to put the new version in service
                reopen()
    duration = (time.perf_counter() - started) * 1000
    opened = times["opened"]
    blocked = (opened - times.get("closed", opened)) * 1000
    in_window = (opened - times.get("window", opened)) * 1000
    host.logger.info(
        "unit %s reloaded in %.1f ms (uses held %.2f ms, window %.2f ms)", unit_id, duration, blocked, in_window
    )
    return restored, evidence, (duration, blocked, in_window)


def _refuse(
    host: Engine,
    unit_id: str,
    stage: str,
    exc: BaseException,
    old: LoadedUnit | None,
    rollback_source: Callable[[], bool] | None,
) -> ReloadError:
    """A reload given up before anything of the old version was touched: it serves on (a unit loaded for the
    first time is recorded as failed)."""
    trace = host.unit_traceback(unit_id, exc)  # before the rollback: the lines shown are the ones attempted
    source_restored = _roll_back_source(host, unit_id, rollback_source)
    if old is None:
        host._load_errors[unit_id] = host._describe(exc)
    return host._failure(
        unit_id,
        stage,
        exc,
        rolled_back=old is not None,
        source_restored=source_restored,
        trace=trace,
        first=old is None,
    )


def _prepare(host: Engine, unit_id: str) -> Prepared:
    """Read, compile and import the unit's new version into fresh modules, then put back in sys.modules what
    serves now: nothing of the new version is visible until the swap."""
    serving = host._unit_modules(unit_id)
    host._purge(unit_id)
    modules: dict[str, types.ModuleType] = {}
    try:
        module = importlib.import_module(host.module_name(unit_id))
        modules = host._unit_modules(unit_id)
    finally:
        host._purge(unit_id)
        for name, new in modules.items():  # an import binds a module to its package: unbind what it bound
            parent, _, child = name.rpartition(".")
            if getattr(sys.modules.get(parent), child, None) is new:
                delattr(sys.modules[parent], child)
        install(serving)
    if host._transaction_thread != threading.get_ident():
        raise ReloadTimeout("the import returned after the reload had given up on it; discarded")
    return Prepared(module, modules, version_of(module, modules))


def _swap(
    host: Engine,
    unit_id: str,
    old: LoadedUnit | None,
    prepared: Prepared,
    rollback_source: Callable[[], bool] | None,
    given: Any,
    gate: Gate,
    times: dict[str, float],
    reopen: Callable[[], None],
) -> tuple[bool, dict[str, Any]]:
    """Quiesce, then the window, with no use of the unit running: close → drain → snapshot → migrate → drop →
    swap → init → restore → reopen, as ONE job on the reload worker, which takes the host lock itself: nothing
    in the window waits for another thread to be woken (on a loaded machine each such hand-over waited for a
    CPU, then for the GIL, and was most of the window). Each stage is still bounded on its own (the drain by
    `drain_timeout`, the others by `reload_timeout`); a job given up on while it held the host lock has the lock
    taken back from it. The job opens the unit to uses again once the new version serves; a unit that owned the
    active activity opens after its re-activation, here."""
    progress = Progress(stage="drain", module=prepared.module, extra=host.drain_timeout)
    handed = Handed(given)
    seen: dict[str, Any] = {"active_before": None, "owned_active": False}

    def window() -> tuple[LoadedUnit, bool]:
        progress.enter("snapshot")  # not if given up on meanwhile: its caller holds the lock then
        seen["active_before"] = host.active_activity
        seen["owned_active"] = owned = host._activities.owned_by(unit_id)
        return _window(host, unit_id, old, prepared, handed, progress, None if owned else reopen)

    def quiesce_and_window() -> tuple[LoadedUnit, bool]:
        times["closed"] = time.perf_counter()
        if not gate.close(host.drain_timeout):
            raise DrainTimeout(
                f"uses of unit {unit_id} still running after {host.drain_timeout:g} s (drain timeout); "
                "reload refused, the previous version serves on"
            )
        times["window"] = time.perf_counter()
        if not host._lock.acquire(blocking=False):
            raise Contended  # another host operation holds it, and may wait for this worker: not here
        try:
            progress.holder = threading.get_ident()
            return window()
        finally:
            host._lock.release()

    try:
        with quick_switches():
            try:
                new, restored = host._bounded(
                    unit_id, lambda: progress.stage, quiesce_and_window, progress=progress, acting=False
                )
            except Contended:  # the unit stays closed (drained) while this thread waits for the host lock
                with host._guard():
                    new, restored = host._bounded(unit_id, lambda: progress.stage, window, progress=progress)
    except (Exception, SystemExit) as exc:
        with _taken_back(host, progress):
            new, restored = _failed_stage(host, unit_id, old, prepared, rollback_source, handed, progress, seen, exc)
    with host._guard():
        host._loaded[unit_id] = new
        host._load_errors.pop(unit_id, None)
        active_before, owned_active = seen["active_before"], seen["owned_active"]
        return restored, host._activities.reactivate(unit_id, active_before, owned_active, host._describe)


@contextlib.contextmanager
def _taken_back(host: Engine, progress: Progress) -> Iterator[None]:
    """The host lock, taken back from the window's worker if it was given up on while it held it."""
    if not host._lock.take_back(progress.holder):
        host._lock.acquire()
    try:
        yield
    finally:
        host._lock.release()


def _failed_stage(
    host: Engine,
    unit_id: str,
    old: LoadedUnit | None,
    prepared: Prepared,
    rollback_source: Callable[[], bool] | None,
    handed: Handed,
    progress: Progress,
    seen: dict[str, Any],
    exc: BaseException,
) -> tuple[LoadedUnit, bool]:
    """After a failed or hung stage of the quiesce or the window: `ReloadError` if refused (the old version
    untouched) or rolled back (the old version back with its state); the new version if only drop() failed
    by hanging (it is then brought in on a new worker)."""
    reactivate = seen["active_before"] if seen["owned_active"] else None
    if progress.stage in ("drain", "snapshot", "migrate"):
        raise _refuse(host, unit_id, progress.stage, exc, old, rollback_source) from exc
    if progress.stage != "drop":
        raise _failed_window(host, unit_id, old, handed, progress, exc, rollback_source, reactivate) from exc
    # drop() hung: given up on as a failing drop is (logged), and the new version comes in on a new worker
    host.logger.error("drop() of unit %s failed: %s", unit_id, host._describe(exc))
    host._discard(unit_id)
    progress = Progress(stage="init", module=prepared.module)
    try:
        new, restored = host._bounded(
            unit_id,
            lambda: progress.stage,
            lambda: _bring_in(host, unit_id, prepared, *handed.for_new(), progress),
        )
    except (Exception, SystemExit) as late:
        raise _failed_window(host, unit_id, old, handed, progress, late, rollback_source, reactivate) from late
    return new, restored


def _window(
    host: Engine,
    unit_id: str,
    old: LoadedUnit | None,
    prepared: Prepared,
    handed: Handed,
    progress: Progress,
    reopen: Callable[[], None] | None,
) -> tuple[LoadedUnit, bool]:
    """The window's stages in the reload worker; `progress` says which one failed or hangs. With `reopen`, the
    new version is put in service and the unit opened to uses here, past the point of no return."""
    if old is not None:
        snapshot = old.hook("snapshot")
        if snapshot is not None:
            handed.has_state = True
            own = handed.given is OWN_STATE  # else the old state is only kept for a failure: not migrated
            handed.state = _handed_over(host, old, prepared, snapshot, progress) if own else snapshot()
        elif callable(prepared.module.__dict__.get("migrate")) and old.version != prepared.version:
            host.logger.info("unit %s has migrate() but its previous version had no snapshot(): not run", unit_id)
        progress.enter("drop")
        host._teardown(old, here=True)
    progress.enter("init")
    if old is not None:
        host._discard(unit_id)
    new, restored = _bring_in(host, unit_id, prepared, *handed.for_new(), progress)
    if reopen is not None:
        progress.commit()
        host._loaded[unit_id] = new
        host._load_errors.pop(unit_id, None)
        reopen()
    return new, restored


def _failed_window(
    host: Engine,
    unit_id: str,
    old: LoadedUnit | None,
    handed: Handed,
    progress: Progress,
    exc: BaseException,
    rollback_source: Callable[[], bool] | None,
    reactivate: str | None,
) -> ReloadError:
    """init or restore of the new version failed: it goes, the old version comes back with its state."""
    trace = host.unit_traceback(unit_id, exc)
    if progress.loaded is not None:
        host._teardown(progress.loaded)
    else:
        host._discard(unit_id)
    source_restored = _roll_back_source(host, unit_id, rollback_source)
    reinstated = old is not None and _reinstate(host, old, handed.state, handed.has_state, reactivate)
    if not reinstated:
        host._loaded.pop(unit_id, None)
        host._load_errors[unit_id] = host._describe(exc)
    return host._failure(
        unit_id,
        progress.stage,
        exc,
        rolled_back=reinstated,
        source_restored=source_restored,
        trace=trace,
        first=old is None,
    )


def _handed_over(
    host: Engine, old: LoadedUnit, prepared: Prepared, snapshot: Callable[[], Any], progress: Progress
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
    host: Engine, unit_id: str, prepared: Prepared, state: Any, has_state: bool, progress: Progress
) -> tuple[LoadedUnit, bool]:
    """swap → init → restore (the old version is torn down already)."""
    install(prepared.modules)
    host._pending_activities = []
    progress.loaded = host._init(unit_id, prepared.module)
    progress.loaded.version = prepared.version
    progress.stage = "restore"
    restore = progress.loaded.hook("restore")
    if has_state and restore is not None:
        restore(state)
        return progress.loaded, True
    return progress.loaded, False


def _roll_back_source(host: Engine, unit_id: str, rollback_source: Callable[[], bool] | None) -> bool:
    if rollback_source is None:
        return False
    try:
        return rollback_source()
    except Exception:
        host.logger.exception("restoring the previous source of unit %s failed", unit_id)
        return False


def _reinstate(host: Engine, old: LoadedUnit, state: Any, has_state: bool, reactivate: str | None) -> bool:
    """Put the previous module objects back and bring them up again with their state."""
    install(old.modules)
    host._pending_activities = []
    try:
        init = old.hook("init")
        if init is not None:
            host._initialising = old.unit_id
            try:
                init(host)
            finally:
                host._initialising = None
        restore = old.hook("restore")
        if has_state and restore is not None:
            restore(state)
    except Exception as exc:
        host.logger.exception("putting back the previous version of unit %s failed", old.unit_id)
        host._discard(old.unit_id)
        host._load_errors[old.unit_id] = host._describe(exc)
        return False
    old.activities = list(host._pending_activities)
    host._loaded[old.unit_id] = old
    if reactivate is not None and reactivate in host._activities:
        try:
            host.activate(reactivate)
        except Exception:
            host.logger.exception("re-activating %s after a rollback failed", reactivate)
    return True
