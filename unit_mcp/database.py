"""One SQL layer under every store of unit-mcp (the change log, the session store, the SQLite and PostgreSQL
loaders): a `SqliteDatabase` or a `PostgresDatabase` with write and read transactions, SQL written with `?`
placeholders in both, one outage error (`Unavailable`), and private files. `connect_sqlite` and `connect_postgres`
are the one place a connection of each kind is opened.

A leaf: both wings import it; it imports `psycopg` only where a PostgreSQL connection is made.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from .errors import Unavailable
from .paths import UnsafePath, open_private
from .pgconnect import CONNECT_OPTIONS, first_line

if TYPE_CHECKING:
    import psycopg

__all__ = ["Conn", "PostgresDatabase", "SqliteDatabase", "Unavailable", "connect_postgres", "connect_sqlite"]
IDLE_CHECK = 0.5  # seconds: a pooled connection idle longer is checked before use (a restart may have dropped it)


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Conn(Protocol):
    """What a transaction hands out: statements with `?` placeholders in either dialect."""

    def execute(self, sql: str, args: Sequence[Any] = ..., /) -> Cursor: ...
    def executemany(self, sql: str, rows: Sequence[Sequence[Any]], /) -> Any: ...


# -- private files ----------------------------------------------------------------------------------

Private = Literal["create", "check"]
"""How a database file is made private: `create` makes it 0600 when missing (an existing file is used as it is);
`check` also refuses an existing file that is not a 0600 file of this user (another user may have made it)."""


def create_private(path: Path, schema: str | None = None) -> None:
    """Create `path` 0600 if missing, no symbolic link followed (SQLite gives its -wal and -shm files its mode).
    With `schema`, the database is made whole under a private name and then linked in place (never over an existing
    file): another process opening the same new path at that moment sees no file or a whole database, never an
    empty one (which a store refuses as not its own)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    if schema is None:
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, flags, 0o600))
        return
    if os.path.lexists(path):
        return
    made = path.with_name(f".{path.name}.{secrets.token_hex(6)}.new")
    os.close(os.open(made, flags, 0o600))
    try:
        conn = connect_sqlite(made)
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(f"BEGIN IMMEDIATE;{schema}COMMIT;")
        finally:
            conn.close()
        with contextlib.suppress(FileExistsError):
            os.link(made, path)
    finally:
        for leftover in (made, made.with_name(made.name + "-wal"), made.with_name(made.name + "-shm")):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def check_private(path: Path) -> None:
    """Create `path` 0600 if missing (`paths.open_private`: no symbolic link followed), refusing a file that is not
    ours (another local user may have pre-created it)."""
    try:
        fd = open_private(path, os.O_RDWR | os.O_CREAT)
    except (OSError, UnsafePath) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise PermissionError(f"{path} cannot be opened as a private file ({reason}); remove it") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise PermissionError(f"{path} is not a private file of this user (mode 0600); remove it")
    finally:
        os.close(fd)


# -- SQLite -----------------------------------------------------------------------------------------


def connect_sqlite(path: str | os.PathLike[str], *, read_only: bool = False, timeout: float = 30) -> sqlite3.Connection:
    """The one place a SQLite connection is opened: autocommit mode (transactions are explicit), usable from any
    thread (callers hold a lock), waiting up to `timeout` seconds for another writer. `read_only` opens the file
    as it is (never created, never written)."""
    if read_only:
        uri = Path(path).absolute().as_uri() + "?mode=ro"
        return sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=timeout)
    return sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=timeout)


class SqliteDatabase:
    """One SQLite file shared by a process's threads: one connection, opened at once (and again after `close`),
    used under a lock; writes are `BEGIN IMMEDIATE` transactions (the write lock is taken before anything is read,
    so a check and a write are one)."""

    dialect = "sqlite"
    errors: tuple[type[Exception], ...] = (sqlite3.Error,)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        read_only: bool = False,
        private: Private | None = None,
        synchronous: str = "NORMAL",  # with WAL: a crash loses nothing committed; a power loss may
        foreign_keys: bool = False,
        schema: str | None = None,
        schema_version: int | None = None,
        check: Callable[[Path], None] | None = None,
        wal_refused: Callable[[Path], Exception] | None = None,
    ) -> None:
        """`schema` runs in one transaction on opening for writing (when the file's user_version is below
        `schema_version`, if given); `check` may refuse the file before it is opened; `wal_refused` makes a file
        system that refuses WAL an error."""
        self.path = Path(path)
        self.read_only = read_only
        self.synchronous = synchronous
        self._private = private
        self._foreign_keys = foreign_keys
        self._schema = schema
        self._schema_version = schema_version
        self._check = check
        self._wal_refused = wal_refused
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self.get()

    def connect(self) -> sqlite3.Connection:
        """A new connection to the file with this database's settings (a watcher's own, beside the shared one)."""
        conn = connect_sqlite(self.path)
        if self._foreign_keys:
            conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        return conn

    def _open(self) -> sqlite3.Connection:
        if self._check is not None:
            self._check(self.path)
        if not self.read_only:
            if self._private == "check":
                check_private(self.path)
            elif self._private == "create":
                self.path.parent.mkdir(parents=True, exist_ok=True)
                create_private(self.path, self._schema)
        conn = self.connect()
        try:
            if not self.read_only:
                wal = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal"
                if not wal and self._wal_refused is not None:
                    raise self._wal_refused(self.path)
                if self._schema is not None and (
                    self._schema_version is None
                    or conn.execute("PRAGMA user_version").fetchone()[0] < self._schema_version
                ):
                    conn.executescript(f"BEGIN IMMEDIATE;{self._schema}COMMIT;")
        except BaseException:
            conn.close()
            raise
        return conn

    def get(self) -> sqlite3.Connection:
        """The shared connection, opened again after `close`."""
        with self._lock:
            if self._conn is None:
                self._conn = self._open()
            return self._conn

    @contextlib.contextmanager
    def write(self, *, lock: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction (`lock` is PostgreSQL's: here every writer waits for the file's write lock)."""
        with self._lock:
            conn = self.get()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: its reads all see one snapshot."""
        with self._lock:
            conn = self.get()
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    def execute(self, sql: str, args: Sequence[Any] = (), /) -> sqlite3.Cursor:
        """One statement in its own transaction (the caller holds a lock of its own while it reads the cursor)."""
        with self._lock:
            return self.get().execute(sql, args)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]], /) -> sqlite3.Cursor:
        with self._lock:
            return self.get().executemany(sql, rows)

    def query(self, sql: str, args: Sequence[object] = ()) -> list[Any]:
        with self._lock:
            return self.get().execute(sql, tuple(args)).fetchall()

    @contextlib.contextmanager
    def durable(self) -> Iterator[None]:
        """Commits made inside reach the disk, with every commit before them (a FULL commit syncs the log)."""
        with self._lock:
            self.get().execute("PRAGMA synchronous = FULL")
            try:
                yield
            finally:
                self.get().execute(f"PRAGMA synchronous = {self.synchronous}")

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


# -- PostgreSQL -------------------------------------------------------------------------------------


def connect_postgres(address: str, *, name: str, settings: Mapping[str, str] | None = None) -> psycopg.Connection[Any]:
    """The one place a PostgreSQL connection is opened (`pgconnect.CONNECT_OPTIONS`: autocommit, bounded waits),
    named `name` in pg_stat_activity, with `settings` for the whole session. Raises the driver's error."""
    import psycopg

    conn = psycopg.connect(address, application_name=name, **CONNECT_OPTIONS)
    for setting, value in (settings or {}).items():
        conn.execute("SELECT set_config(%s, %s, false)", (setting, value))
    return conn


@functools.lru_cache(maxsize=1024)
def _pg_sql(sql: str) -> str:
    """`?` placeholders as psycopg's `%s` (a literal % doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


class PgConn:
    """A psycopg connection behind the stores' SQL: `?` placeholders. `raw` is the driver's connection."""

    __slots__ = ("raw",)

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw

    def execute(self, sql: str, args: Sequence[Any] = (), /) -> Any:
        if not args:
            return self.raw.execute(sql)  # type: ignore[arg-type]
        return self.raw.execute(_pg_sql(sql), args)  # type: ignore[arg-type]

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]], /) -> None:
        with self.raw.cursor() as cursor:
            cursor.executemany(_pg_sql(sql), rows)  # type: ignore[arg-type]


class PostgresDatabase:
    """A PostgreSQL database: idle connections kept for reuse (at most `size`). A connection that failed is dropped
    with every idle one (they were made to the same server), and a new one is made on the next call, so an outage
    fails calls at once (as `unavailable(reason)`) and ends by itself (no reconnect backoff to wait out)."""

    dialect = "postgresql"

    def __init__(
        self,
        address: str,
        *,
        name: str,
        unavailable: Callable[[str], Unavailable],
        size: int = 8,
        settings: Mapping[str, str] | None = None,
        lock: str | None = None,
    ) -> None:
        """`settings` hold for every connection (e.g. search_path); `lock` is the statement every write
        transaction runs first, the one that orders writers (an advisory lock, a row FOR UPDATE)."""
        import psycopg

        self.address = address
        self.errors: tuple[type[Exception], ...] = (psycopg.Error,)
        self._name = name
        self._unavailable = unavailable
        self._size = size
        self._settings = dict(settings or {})
        self._lock_sql = lock
        self._idle: list[tuple[psycopg.Connection[Any], float]] = []  # with when it was put back
        self._pool_lock = threading.Lock()
        self._durable = False

    def connect(self) -> psycopg.Connection[Any]:
        """A new connection of this database's (the listener's own, beside the pool); an outage as `unavailable`."""
        import psycopg

        try:
            return connect_postgres(self.address, name=self._name, settings=self._settings)
        except psycopg.OperationalError as exc:
            raise self.lost(exc) from None

    def lost(self, exc: BaseException) -> Unavailable:
        return self._unavailable(first_line(exc))

    @contextlib.contextmanager
    def connection(self) -> Iterator[PgConn]:
        """A connection of the pool for a few statements; an outage met inside drops it and raises `unavailable`."""
        import psycopg

        with self._pool_lock:
            raw, since = self._idle.pop() if self._idle else (None, 0.0)
        if raw is not None and time.monotonic() - since > IDLE_CHECK:
            try:
                raw.execute("")  # one round trip: a connection the server dropped (a restart) is not used
            except psycopg.Error:
                raw.close()
                raw = None
        if raw is None:
            raw = self.connect()
        try:
            yield PgConn(raw)
        except psycopg.OperationalError as exc:
            raw.close()
            self.close()  # the others were made to the same server: likely dropped too
            raise self.lost(exc) from None
        except BaseException:
            self._release(raw)
            raise
        self._release(raw)

    @contextlib.contextmanager
    def write(self, *, lock: bool = True) -> Iterator[PgConn]:
        """One write transaction, begun with the database's `lock` statement (unless not `lock`: a schema's
        creation, before the lock's table exists)."""
        with self.connection() as conn, self._transaction(conn, "BEGIN"):
            if self._durable:
                conn.raw.execute("SET LOCAL synchronous_commit = on")
            if lock and self._lock_sql is not None:
                conn.execute(self._lock_sql)
            yield conn

    @contextlib.contextmanager
    def read(self) -> Iterator[PgConn]:
        """One read transaction: its reads all see one snapshot."""
        with self.connection() as conn, self._transaction(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"):
            yield conn

    @contextlib.contextmanager
    def _transaction(self, conn: PgConn, begin: str) -> Iterator[None]:
        conn.raw.execute(begin)  # type: ignore[arg-type]
        try:
            yield
        except BaseException:
            if not conn.raw.closed:
                with contextlib.suppress(*self.errors):
                    conn.raw.execute("ROLLBACK")
            raise
        conn.raw.execute("COMMIT")

    def execute(self, sql: str, args: Sequence[Any] = (), /) -> Any:
        """One statement in its own transaction; its cursor holds every row already."""
        with self.connection() as conn:
            return conn.execute(sql, args)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]], /) -> None:
        with self.connection() as conn:
            conn.executemany(sql, rows)

    def query(self, sql: str, args: Sequence[object] = ()) -> list[Any]:
        """A read; one that failed on a connection the server dropped since it was last used (a restart closes
        every connection, and the idle check skips those used within IDLE_CHECK) is tried once more on a new one."""
        try:
            with self.connection() as conn:
                return conn.execute(sql, tuple(args)).fetchall()  # type: ignore[no-any-return]
        except Unavailable:
            with self.connection() as conn:  # the failure emptied the idle list: a new connection
                return conn.execute(sql, tuple(args)).fetchall()  # type: ignore[no-any-return]

    @contextlib.contextmanager
    def durable(self) -> Iterator[None]:
        """Write transactions begun inside wait for the log to reach the disk, with every commit before them."""
        self._durable = True
        try:
            yield
        finally:
            self._durable = False

    def _release(self, raw: psycopg.Connection[Any]) -> None:
        import psycopg

        with self._pool_lock:
            idle = not raw.closed and raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            if idle and len(self._idle) < self._size:
                self._idle.append((raw, time.monotonic()))
                return
        raw.close()

    def close(self) -> None:
        with self._pool_lock:
            idle, self._idle = self._idle, []
        for raw, _ in idle:
            raw.close()
