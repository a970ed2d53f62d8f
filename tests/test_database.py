"""The one SQL layer (`unit_mcp.database`) in both dialects: `?` placeholders beside literal `%` and `?` text,
write transactions that leave nothing on an error, read transactions that see one snapshot, the one outage error,
private files, and one place that opens a connection of each kind."""

from __future__ import annotations

import ast
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.pgcluster import Cluster

from unit_mcp.agent.errors import SessionStoreUnavailable
from unit_mcp.database import PostgresDatabase, SqliteDatabase, Unavailable
from unit_mcp.errors import StoreUnavailable

PACKAGE = Path(__file__).resolve().parent.parent / "unit_mcp"
TABLE = "CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL)"


class Outage(Unavailable):
    pass


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqliteDatabase | PostgresDatabase]:
    made: SqliteDatabase | PostgresDatabase
    if request.param == "sqlite":
        made = SqliteDatabase(tmp_path / "t.db", private="check", schema=TABLE + ";")
    else:
        cluster: Cluster = request.getfixturevalue("pg_cluster")
        made = PostgresDatabase(cluster.new_database(), name="unit-mcp-test", unavailable=Outage)
        with made.write() as conn:
            conn.execute(TABLE)
    try:
        yield made
    finally:
        made.close()


TEXT = st.text(alphabet=st.sampled_from("a?%s()'\"\\ 0é"), max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=TEXT, second=TEXT)
def test_question_marks_are_the_placeholders_in_both_dialects(
    db: SqliteDatabase | PostgresDatabase, first: str, second: str
) -> None:
    """Values holding ?, % and %s arrive as given, beside a literal % in the statement (doubled only for psycopg)."""
    with db.write() as conn:
        conn.execute("DELETE FROM notes")
        conn.executemany("INSERT INTO notes (id, body) VALUES (?, ?)", [(1, first), (2, second)])
        row = conn.execute("SELECT body || '%', ? FROM notes WHERE id = ?", (second, 1)).fetchone()
    assert tuple(row) == (first + "%", second)
    assert [body for (body,) in db.query("SELECT body FROM notes WHERE body LIKE '%' ORDER BY id")] == [first, second]


def test_a_failed_write_transaction_leaves_nothing(db: SqliteDatabase | PostgresDatabase) -> None:
    with pytest.raises(ZeroDivisionError), db.write() as conn:
        conn.execute("INSERT INTO notes (id, body) VALUES (?, ?)", (7, "half"))
        1 / 0  # noqa: B018
    assert db.query("SELECT count(*) FROM notes WHERE id = ?", (7,))[0][0] == 0
    with db.write() as conn:  # the connection is usable after the rollback
        conn.execute("INSERT INTO notes (id, body) VALUES (?, ?)", (7, "whole"))
    assert db.query("SELECT body FROM notes WHERE id = ?", (7,)) == [("whole",)]


def test_a_read_transaction_sees_one_snapshot(db: SqliteDatabase | PostgresDatabase, tmp_path: Path) -> None:
    other: SqliteDatabase | PostgresDatabase
    if isinstance(db, SqliteDatabase):
        other = SqliteDatabase(db.path)
    else:
        other = PostgresDatabase(db.address, name="unit-mcp-test", unavailable=Outage)
    try:
        with db.read() as conn:
            before = conn.execute("SELECT count(*) FROM notes").fetchone()[0]
            with other.write() as writer:
                writer.execute("INSERT INTO notes (id, body) VALUES (?, ?)", (100, "later"))
            assert conn.execute("SELECT count(*) FROM notes").fetchone()[0] == before
        assert db.query("SELECT count(*) FROM notes")[0][0] == before + 1
    finally:
        other.close()


def test_an_unreachable_database_is_the_one_outage_error_with_the_stores_message() -> None:
    with socket.socket() as probe:  # a port nobody listens on: refused at once
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    db = PostgresDatabase(
        f"postgresql://nobody@127.0.0.1:{port}/x",
        name="unit-mcp-test",
        unavailable=lambda reason: StoreUnavailable(f"The units database is unreachable or held up ({reason})."),
    )
    with pytest.raises(Unavailable) as caught:
        db.query("SELECT 1")
    assert isinstance(caught.value, StoreUnavailable)
    assert caught.value.message.startswith("The units database is unreachable or held up (")
    assert "\n" not in caught.value.message
    assert issubclass(SessionStoreUnavailable, Unavailable)


def test_a_private_database_file_of_another_mode_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "changes.db"
    path.write_bytes(b"")
    path.chmod(0o644)
    with pytest.raises(PermissionError, match="not a private file"):
        SqliteDatabase(path, private="check")
    made = tmp_path / "made.db"
    SqliteDatabase(made, private="create").close()
    assert made.stat().st_mode & 0o777 == 0o600


def test_only_the_sql_layer_opens_a_connection() -> None:
    """`sqlite3.connect` and `psycopg.connect` are called in unit_mcp/database.py and nowhere else."""
    callers: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "connect"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in {"sqlite3", "psycopg"}
            ):
                callers.setdefault(node.func.value.id, set()).add(os.path.relpath(path, PACKAGE))
    assert callers == {"sqlite3": {"database.py"}, "psycopg": {"database.py"}}
