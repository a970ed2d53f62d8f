"""What every PostgreSQL store of unit-mcp shares (the units loader, the agent session store): which addresses
select PostgreSQL, why one cannot be used before connecting (a password in it, no database, no driver), how it
is printed, the connection options, and the check that a schema is ours before anything is written.

A leaf: both wings import it; it imports `psycopg` only where a connection is made or checked.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

if TYPE_CHECKING:
    import psycopg

PREFIXES = ("postgresql://", "postgres://")
MISSING_DRIVER = "needs the PostgreSQL driver: pip install 'unit-mcp[postgres]'"
CONNECT_TIMEOUT = 3  # seconds: a call during an outage is refused within this (connection refused: at once)
# A peer that vanished (a network partition, a host gone) is noticed: unacknowledged data after 4 s, an idle
# connection (the listener's) after about 9 s. A server process that is frozen but whose kernel answers is not.
CONNECT_OPTIONS: dict[str, Any] = {
    "autocommit": True,
    "connect_timeout": CONNECT_TIMEOUT,
    "tcp_user_timeout": 4000,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 2,
}


class ForeignSchema(Exception):
    """The database holds something that is not this store: one line for the operator; nothing was written."""


def is_postgres(address: object) -> bool:
    return isinstance(address, str) and address.startswith(PREFIXES)


def address_problem(address: str) -> str | None:
    """Why a `postgresql://` address cannot be used before connecting, or None."""
    parts = urlsplit(address)
    if parts.password is not None or "password" in parse_qs(parts.query):
        return (
            "carries a password; leave it out (command lines are visible to other users) and set PGPASSWORD or "
            "PGPASSFILE (a ~/.pgpass file) instead"
        )
    if not parts.path.strip("/"):
        return "names no database; give postgresql://USER@HOST:PORT/DATABASE"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return MISSING_DRIVER
    return None


def shown_address(address: str) -> str:
    """An address as it may be printed: a password replaced by ***."""
    parts = urlsplit(address)
    if parts.password is None:
        return address if "password" not in parse_qs(parts.query) else urlunsplit(parts._replace(query="***"))
    netloc = f"{parts.username or ''}:***@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit(parts._replace(netloc=netloc))


def held_passwords() -> list[str]:
    """The passwords libpq would give a server of this user: PGPASSWORD, and every password of its password file
    (PGPASSFILE, else ~/.pgpass), so that results can hide them."""
    found = [os.environ.get("PGPASSWORD", "")]
    passfile = Path(os.environ.get("PGPASSFILE") or Path.home() / ".pgpass")
    with contextlib.suppress(OSError, UnicodeDecodeError):
        for line in passfile.read_text().splitlines():
            fields = re.split(r"(?<!\\):", line.strip(), maxsplit=4)
            if len(fields) == 5 and not line.startswith("#"):
                found.append(fields[4].replace("\\:", ":").replace("\\\\", "\\"))
    return [password for password in found if password]


def first_line(exc: BaseException) -> str:
    """A driver error in one line (PostgreSQL's messages run over several)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def schema_is_ours(conn: psycopg.Connection[Any], schema: str, mark: str, *, alone: bool) -> bool:
    """True when `schema` exists, carries `mark` (the comment its creator left) and is ours (`_require_ours`: a
    comment anyone can copy); False when it does not exist
    (the caller creates it, under a lock of its own). `ForeignSchema` when it exists without the mark, or (`alone`:
    a store that wants the database to itself) when it is missing and the database holds tables other than
    unit-mcp's own stores."""
    marked = conn.execute(
        "SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = %s", (schema,)
    ).fetchone()
    if marked is not None:
        if marked[0] != mark:
            raise ForeignSchema(f"has a schema {schema} that unit-mcp did not make; give another database")
        _require_ours(conn, schema)
        return True
    if alone:
        others = conn.execute(
            "SELECT n.nspname || '.' || c.relname FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') "
            "AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%%' "
            "AND coalesce(obj_description(n.oid, 'pg_namespace'), '') NOT LIKE 'unit-mcp %%' ORDER BY 1 LIMIT 4"
        ).fetchall()
        if others:
            shown = ", ".join(name for (name,) in others[:3]) + (", …" if len(others) > 3 else "")
            raise ForeignSchema(
                f"holds tables of something else ({shown}); give an empty database or one made by unit-mcp"
            )
    return False


# Everything in a schema with its owner and its grants: the schema, its tables, views, sequences and indexes, its
# functions and its types. `mine` holds the connecting role and every role it is a member of, followed through
# pg_auth_members itself: a superuser is a member of every role for pg_has_role, not here.
_STRANGERS = """
WITH RECURSIVE mine(oid) AS (
    SELECT oid FROM pg_roles WHERE rolname = current_user
    UNION SELECT m.roleid FROM pg_auth_members m JOIN mine ON m.member = mine.oid
), space AS (SELECT oid FROM pg_namespace WHERE nspname = %(schema)s),
objects(kind, keyword, name, owner, acl) AS (
    SELECT 'schema', 'SCHEMA', nspname::text, nspowner, nspacl FROM pg_namespace WHERE oid = (SELECT oid FROM space)
    UNION ALL
    SELECT CASE c.relkind WHEN 'S' THEN 'sequence' WHEN 'i' THEN 'index' WHEN 'v' THEN 'view' ELSE 'table' END,
           CASE c.relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, %(schema)s || '.' || c.relname,
           c.relowner, c.relacl
    FROM pg_class c WHERE c.relnamespace = (SELECT oid FROM space)
    UNION ALL
    SELECT 'function', 'FUNCTION', %(schema)s || '.' || p.proname, p.proowner, p.proacl
    FROM pg_proc p WHERE p.pronamespace = (SELECT oid FROM space)
    UNION ALL
    SELECT 'type', 'TYPE', %(schema)s || '.' || t.typname, t.typowner, NULL
    FROM pg_type t WHERE t.typnamespace = (SELECT oid FROM space)
)
SELECT * FROM (
    SELECT kind, keyword, name, pg_get_userbyid(owner) AS owner, NULL AS grants FROM objects
    WHERE owner NOT IN (SELECT oid FROM mine)
    UNION ALL
    SELECT kind, keyword, name, NULL, CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END
           || ':' || string_agg(DISTINCT a.privilege_type, ', ')
    FROM objects, aclexplode(acl) a
    WHERE a.grantee NOT IN (SELECT oid FROM mine)
          AND NOT (kind = 'function' AND a.grantee = 0 AND a.privilege_type = 'EXECUTE')  -- PostgreSQL's default
    GROUP BY kind, keyword, name, a.grantee
) found ORDER BY owner IS NULL, kind <> 'schema', name LIMIT 1
"""


def _require_ours(conn: psycopg.Connection[Any], schema: str) -> None:
    """`ForeignSchema` unless the schema and everything in it is owned by the connecting role (or a role it is a
    member of) and grants nothing to other roles: a role with CREATE on the database could have made it first, with
    our DDL and comment, and one with a grant could change what the store holds."""
    found = conn.execute(_STRANGERS, {"schema": schema}).fetchone()  # type: ignore[arg-type]
    if found is None:
        return
    kind, keyword, name, owner, grants = found
    me = conn.execute("SELECT current_user").fetchone()
    if owner is not None:
        raise ForeignSchema(
            f"has a {kind} {name} owned by role {owner}, not by you ({me[0] if me else '?'}) or a role you are a "
            f"member of: {owner} could change what it holds; drop it as that role, or give a database where other "
            "roles have no CREATE (docs/postgres.md)"
        )
    grantee, _, privileges = grants.partition(":")
    raise ForeignSchema(
        f"has a {kind} {name} that grants {privileges} to {grantee}, who could read or change what it holds; run "
        f"`REVOKE ALL ON {keyword} {name} FROM {grantee}` as its owner (docs/postgres.md)"
    )
