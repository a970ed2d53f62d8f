"""One SQLite connection shared by a process's threads: opened on first use, used under a lock, and written in
`BEGIN IMMEDIATE` transactions (the write lock is taken before anything is read, so a check and a write are one).
The SQLite loader and the change log both keep their database through it."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any


class SharedConnection:
    """`open_` makes the connection (autocommit mode: transactions are explicit); it runs once, under the lock."""

    def __init__(self, open_: Callable[[], sqlite3.Connection]) -> None:
        self._open = open_
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None

    def get(self) -> sqlite3.Connection:
        """The connection, opened again after `close`."""
        with self._lock:
            if self._conn is None:
                self._conn = self._open()
            return self._conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self.get()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def query(self, sql: str, args: Sequence[object] = ()) -> list[Any]:
        with self._lock:
            return self.get().execute(sql, tuple(args)).fetchall()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
