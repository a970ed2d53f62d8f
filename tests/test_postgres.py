"""The PostgreSQL loader beyond the shared contract (test_loaders.py): addresses without passwords, foreign databases
refused, replicas that share one database (pushed changes, one winner per hash, a killed listener, an outage)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from conftest import copy_units, postgres_copy
from pgcluster import Cluster

from unit_mcp import Host, UnitService
from unit_mcp.errors import UnitError
from unit_mcp.loader import Source, StaleSource
from unit_mcp.paths import hash_bytes
from unit_mcp.units import UnusableStore, open_loader

GREETER = Source("greeter", "file", "greeter.py")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)


def sql(address: str, statement: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """One statement on its own connection, as psql would run it."""
    with psycopg.connect(address, autocommit=True) as conn:
        cursor = conn.execute(statement, args)  # type: ignore[arg-type]
        return cursor.fetchall() if cursor.description else []


def wait_for(condition: object, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.fixture
def database(pg_cluster: Cluster, tmp_path: Path) -> str:
    return postgres_copy(pg_cluster, copy_units(tmp_path / "units"))


@pytest.fixture
def replicas(database: str, tmp_path: Path) -> Iterator[list[UnitService]]:
    """Two hosts on one database, each with its own loader and watch, as two servers would be."""
    hosts = [Host(open_loader(database), tmp_path / f"data{n}", namespace=f"replica{n}").start() for n in range(2)]
    for host in hosts:
        host.start_watching()
    yield [UnitService(host) for host in hosts]
    for host in hosts:
        host.close()
        host.loader.close()


# -- addresses and foreign databases -------------------------------------------------------------------------


def test_an_address_with_a_password_is_refused_without_showing_it() -> None:
    address = "postgresql://alice:s3cret-pw@127.0.0.1:5/units"
    for args in (("-m", "unit_mcp.server", "--units", address), ("-m", "unit_mcp.units", "copy", address, "/tmp")):
        done = run(*args)
        assert done.returncode == 2 and "s3cret-pw" not in done.stderr + done.stdout, done.stderr
        assert "PGPASSWORD or PGPASSFILE" in done.stderr and "alice:***@127.0.0.1:5" in done.stderr
        assert "Traceback" not in done.stderr
    assert "names no database" in run("-m", "unit_mcp.server", "--units", "postgres://alice@127.0.0.1:5").stderr


def test_without_the_driver_the_address_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None; from unit_mcp.server import main; "
        "sys.exit(main(['--units', 'postgresql://alice@127.0.0.1:5/units']))"
    )
    done = run("-c", code)
    assert done.returncode == 2 and "pip install 'unit-mcp[postgres]'" in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert errors == [done.stderr.strip().splitlines()[-1]] and "Traceback" not in done.stderr  # after the usage


def test_a_foreign_database_is_refused_before_anything_is_written(pg_cluster: Cluster, tmp_path: Path) -> None:
    app = pg_cluster.new_database()
    sql(app, "CREATE TABLE orders (id int)")
    with pytest.raises(UnusableStore, match=r"holds tables of something else \(public.orders\)"):
        open_loader(app)
    assert sql(app, "SELECT 1 FROM pg_namespace WHERE nspname = 'unit_mcp'") == []
    squatter = pg_cluster.new_database()
    sql(squatter, "CREATE SCHEMA unit_mcp")
    with pytest.raises(UnusableStore, match="has a schema unit_mcp that unit-mcp did not make"):
        open_loader(squatter)
    changed = pg_cluster.new_database()
    open_loader(changed).close()
    sql(changed, "ALTER TABLE unit_mcp.sources ALTER COLUMN data TYPE text")
    with pytest.raises(UnusableStore, match=r"has a table unit_mcp\.sources unlike unit-mcp's"):
        open_loader(changed)

    served = run("-m", "unit_mcp.server", "--units", app, "--data-dir", str(tmp_path / "data"))
    assert served.returncode == 1 and "Traceback" not in served.stderr
    assert served.stderr.strip().splitlines()[-1].startswith(f"unit-mcp: error: cannot serve --units {app} holds")


def test_unit_ids_the_folder_loader_would_refuse_are_skipped_with_a_log_line(
    database: str, caplog: pytest.LogCaptureFixture
) -> None:
    sql(database, "INSERT INTO unit_mcp.units VALUES ('bad-id', 'file'), ('class', 'file')")
    sql(database, "INSERT INTO unit_mcp.sources VALUES ('bad-id', 'bad-id.py', 'X = 1'), ('class', 'class.py', '')")
    loader = open_loader(database)
    assert set(loader.discover()) == {"broken", "counter", "greeter", "json", "looper", "notes", "weather"}
    assert loader.kind("bad-id") is None
    assert "'bad-id' in the units database is not a valid unit id: skipped" in caplog.text and "'class'" in caplog.text
    loader.close()


def test_copy_to_and_from_postgres_is_bytes_exact(pg_cluster: Cluster, tmp_path: Path) -> None:
    folder = copy_units(tmp_path / "units")
    (folder / "counter" / "logo.png").write_bytes(b"\x89PNG\x00\xff\r\n")
    database = pg_cluster.new_database()
    done = run("-m", "unit_mcp.units", "copy", str(folder), database)
    assert done.returncode == 0 and "copied 7 units" in done.stdout, done.stderr
    back = tmp_path / "back"
    back.mkdir()
    assert run("-m", "unit_mcp.units", "copy", database, str(back)).returncode == 0
    for path in folder.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            assert (back / path.relative_to(folder)).read_bytes() == path.read_bytes(), path
    refused = run("-m", "unit_mcp.units", "copy", str(folder), database)
    assert refused.returncode == 1 and "already has units" in refused.stderr


def test_a_rollback_leaves_a_newer_writers_bytes(database: str) -> None:
    mine, theirs = open_loader(database), open_loader(database)
    before = mine.read(GREETER)
    written = mine.write(GREETER, before + b"# mine\n", expected_hash=hash_bytes(before), tool_call="unit_apply_patch")
    newer = before + b"# theirs\n"
    theirs.write(GREETER, newer, expected_hash=hash_bytes(before + b"# mine\n"), tool_call="unit_apply_patch")
    with pytest.raises(StaleSource):
        mine.rollback(written)
    assert mine.read(GREETER) == newer
    assert mine.history(GREETER, 1)[0].hash == hash_bytes(newer)
    mine.close()
    theirs.close()


# -- replicas on one database -----------------------------------------------------------------------------


def test_two_replicas_racing_on_one_hash_have_one_winner_every_time(replicas: list[UnitService]) -> None:
    for n in range(200):
        base = replicas[0].read_source("greeter", "greeter.py")
        outcomes: list[str] = []

        def attempt(
            service: UnitService, mark: str, outcomes: list[str] = outcomes, base_hash: str = base.hash, n: int = n
        ) -> None:
            try:
                new = f"import logging\n# {n}{mark}\n"  # keeps the line the next round patches
                service.apply_patch("greeter", "greeter.py", old="import logging\n", new=new, expected_hash=base_hash)
                outcomes.append("won")
            except UnitError as exc:
                outcomes.append(exc.code)

        racers = [
            threading.Thread(target=attempt, args=(service, mark)) for service, mark in zip(replicas, "ab", strict=True)
        ]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join()
        assert sorted(outcomes) == ["stale_hash", "won"], (n, outcomes)
