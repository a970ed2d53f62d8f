"""A PostgreSQL schema another role made (security round 4, item 3): a role with CREATE on the database
(`mallory`) pre-creates the `unit_mcp` schema with the loader's own DDL and comment, plus a planted unit, before the
server's role (`alice`, not a superuser) first connects; or alice's own store grants mallory a privilege. The units
store and the session store refuse both in one line naming the role, before any unit runs or anything is written;
a store owned by alice, or by a role she is a member of, is used."""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from support.pgcluster import Cluster

from unit_mcp import Host
from unit_mcp.agent import AgentError, SessionStore
from unit_mcp.pgloader import _DDL, _LOCK_KEY, SCHEMA
from unit_mcp.units import UnusableStore

_NAMES = itertools.count(1)
SESSION_SCHEMA = "unit_mcp_sessions"  # the session store's schema, as docs/sessions.md names it


@dataclass
class Roles:
    """A database alice connects to as the server's role, where mallory may create schemas."""

    cluster: Cluster
    database: str
    alice: str
    mallory: str

    def url(self, role: str) -> str:
        return f"postgresql://{role}@127.0.0.1:{self.cluster.port}/{self.database}"

    def run(self, role: str, sql: str) -> None:
        with psycopg.connect(self.url(role), autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]


@pytest.fixture
def roles(pg_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Roles]:
    """Two login roles (neither a superuser) with the cluster's password, in a PGPASSFILE of this test."""
    suffix = f"{os.getpid()}_{next(_NAMES)}"
    alice, mallory, database = f"alice_{suffix}", f"mallory_{suffix}", f"shared_{suffix}"
    with psycopg.connect(pg_cluster.url(), autocommit=True) as admin:
        for role in (alice, mallory):
            admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{pg_cluster.password}'")  # type: ignore[arg-type]
        admin.execute(f"CREATE DATABASE {database} OWNER {alice}")  # type: ignore[arg-type]
        admin.execute(f"GRANT CREATE ON DATABASE {database} TO {mallory}")  # type: ignore[arg-type]
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:{pg_cluster.port}:*:*:{pg_cluster.password}\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    yield Roles(pg_cluster, database, alice, mallory)


def open_to_all(schema: str) -> str:
    """What mallory grants so that the server's role can use her schema as its own."""
    return (
        f"GRANT ALL ON SCHEMA {schema} TO PUBLIC; GRANT ALL ON ALL TABLES IN SCHEMA {schema} TO PUBLIC; "
        f"GRANT ALL ON ALL SEQUENCES IN SCHEMA {schema} TO PUBLIC"
    )


def planted_units_schema(marker: Path) -> list[str]:
    """What mallory runs to make the units store alice's server will find: the loader's DDL, a unit that writes
    `marker`, and the grants that let alice use it."""
    code = f"open({str(marker)!r}, 'w').write('planted unit ran')\n"
    return [
        _DDL,
        f"INSERT INTO {SCHEMA}.units VALUES ('planted', 'file'); "
        f"INSERT INTO {SCHEMA}.sources VALUES ('planted', 'planted.py', convert_to($${code}$$, 'UTF8'))",
        open_to_all(SCHEMA),
    ]


def refused(roles: Roles, role: str, data: Path) -> str:
    """Why the server's host, connecting as `role`, refuses the units store (one line)."""
    with pytest.raises(UnusableStore) as refusal, Host(roles.url(role), data):
        pass
    message = str(refusal.value)
    assert "\n" not in message, message
    return message.removeprefix(f"{roles.url(role)} ")


def test_units_schema_precreated_by_another_role_is_refused(roles: Roles, tmp_path: Path) -> None:
    marker = tmp_path / "planted-unit-ran"
    for sql in planted_units_schema(marker):
        roles.run(roles.mallory, sql)
    assert refused(roles, roles.alice, tmp_path / "data") == (
        f"has a schema {SCHEMA} owned by role {roles.mallory}, not by you ({roles.alice}) or a role you are a member "
        f"of: {roles.mallory} could change what it holds; drop it as that role, or give a database where other "
        "roles have no CREATE (docs/postgres.md)"
    )
    assert not marker.exists(), "the planted unit ran"


def test_session_schema_precreated_by_another_role_is_refused(roles: Roles) -> None:
    """Mallory makes the store's schema the way the store itself does (tables, mark and all) by opening one."""
    SessionStore(roles.url(roles.mallory)).close()
    roles.run(roles.mallory, open_to_all(SESSION_SCHEMA))
    with pytest.raises(AgentError) as refusal:
        SessionStore(roles.url(roles.alice))
    message = str(refusal.value)
    assert f"has a schema {SESSION_SCHEMA} owned by role {roles.mallory}, not by you ({roles.alice})" in message, (
        message
    )
    assert "\n" not in message


@pytest.mark.parametrize(
    ("grant", "what"),
    [
        ("GRANT INSERT, UPDATE ON {schema}.sources TO {mallory}", "table {schema}.sources"),
        ("GRANT CREATE ON SCHEMA {schema} TO {mallory}", "schema {schema}"),
        ("GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO PUBLIC", "table {schema}."),
        ("ALTER FUNCTION {schema}.record_version() OWNER TO {mallory}", "function {schema}.record_version"),
    ],
)
def test_units_schema_that_lets_another_role_in_is_refused(roles: Roles, tmp_path: Path, grant: str, what: str) -> None:
    with Host(roles.url(roles.alice), tmp_path / "data"):  # alice's own store, made by her server
        pass
    with psycopg.connect(roles.cluster.url(roles.database), autocommit=True) as admin:
        admin.execute(grant.format(schema=SCHEMA, mallory=roles.mallory))  # type: ignore[arg-type]
    message = refused(roles, roles.alice, tmp_path / "data")
    assert what.format(schema=SCHEMA) in message, message
    who = "PUBLIC" if "PUBLIC" in grant else roles.mallory
    assert who in message, message


def test_stores_owned_by_a_role_the_server_is_a_member_of_are_used(roles: Roles, tmp_path: Path) -> None:
    """The control: stores made by a group role alice belongs to are hers too."""
    group = f"team_{roles.alice}"
    with psycopg.connect(roles.cluster.url(), autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {group} LOGIN PASSWORD '{roles.cluster.password}'")  # type: ignore[arg-type]
        admin.execute(f"GRANT CREATE ON DATABASE {roles.database} TO {group}")  # type: ignore[arg-type]
        admin.execute(f"GRANT {group} TO {roles.alice}")  # type: ignore[arg-type]
    with Host(roles.url(group), tmp_path / "made"):
        pass
    SessionStore(roles.url(group)).close()
    with Host(roles.url(roles.alice), tmp_path / "data") as host:
        assert "greeter" not in host.unit_kinds()
    SessionStore(roles.url(roles.alice)).close()


def test_units_schema_made_by_another_role_while_the_server_waits_for_its_lock_is_refused(
    roles: Roles, tmp_path: Path
) -> None:
    """The race: the server finds no schema, then waits for the lock two starting servers share; mallory (who can
    take that advisory lock too) holds it, makes the schema, and lets go."""
    marker = tmp_path / "planted-unit-ran"
    outcome: list[BaseException | None] = []
    with psycopg.connect(roles.url(roles.mallory), autocommit=True) as mallory:
        mallory.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))

        def start() -> None:
            try:
                refused(roles, roles.alice, tmp_path / "data")
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        starting = threading.Thread(target=start)
        starting.start()
        deadline = time.monotonic() + 30
        while not mallory.execute("SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").fetchone():
            assert time.monotonic() < deadline and starting.is_alive(), outcome
            time.sleep(0.02)
        for sql in planted_units_schema(marker):  # on the connection holding the lock its trigger takes
            mallory.execute(sql)  # type: ignore[arg-type]
        mallory.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
        starting.join(60)
    assert outcome == [None], outcome
    assert not marker.exists(), "the planted unit ran"
