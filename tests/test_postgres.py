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
from support.pgcluster import Cluster

from unit_mcp import Host, UnitService
from unit_mcp.arguments import ListArgs, UnitArgs
from unit_mcp.errors import UnitError
from unit_mcp.loader import Source, SourceTooLarge, StaleSource
from unit_mcp.paths import hash_bytes
from unit_mcp.pgloader import PostgresLoader
from unit_mcp.units import UnusableStore, open_loader

REPO = Path(__file__).resolve().parent.parent
GREETER = Source("greeter", "file", "greeter.py")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=240)


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
    log = pg_cluster.new_database()
    open_loader(log).close()
    sql(log, "CREATE TABLE unit_mcp.changes (id int, note text)")  # where the change log would go
    with pytest.raises(UnusableStore, match=r"has a table unit_mcp\.changes unlike unit-mcp's"):
        open_loader(log)
    untriggered = pg_cluster.new_database()
    open_loader(untriggered).close()
    sql(untriggered, "ALTER TABLE unit_mcp.sources DISABLE TRIGGER source_changed")
    with pytest.raises(UnusableStore, match=r"has lost the trigger on unit_mcp\.sources"):
        open_loader(untriggered)

    served = run("-m", "unit_mcp.server", "--units", app, "--data-dir", str(tmp_path / "data"))
    assert served.returncode == 1 and "Traceback" not in served.stderr
    assert served.stderr.strip().splitlines()[-1].startswith(f"unit-mcp serve: error: cannot serve --units {app} holds")


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


HOSTILE_SOURCE_IDS = ["../escape.py", "/etc/passwd", "a//b.py", "./x.py", "line\nbreak.py", "test_" + "x" * 300 + ".py"]


def test_source_ids_the_folder_loader_would_refuse_are_skipped_with_a_log_line(
    database: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows = ", ".join("('counter', %s, 'X = 1')" for _ in HOSTILE_SOURCE_IDS)
    sql(database, f"INSERT INTO unit_mcp.sources VALUES {rows}", tuple(HOSTILE_SOURCE_IDS))
    loader = open_loader(database)
    assert loader.source_ids("counter", "directory") == ["__init__.py", "panel.py", "test_init.py"]
    assert [s.source_id for s in loader.sources("counter", "directory")] == ["__init__.py", "panel.py", "test_init.py"]
    skipped = [r.getMessage() for r in caplog.records if "is not a valid source id: skipped" in r.getMessage()]
    assert len(skipped) == len(HOSTILE_SOURCE_IDS), skipped  # once each, however often it is listed
    assert "source id '../escape.py' of unit 'counter' in the units database" in skipped[0]
    assert "'line\\nbreak.py'" in caplog.text and "\nbreak" not in caplog.text  # one line each, shown escaped
    host = Host(loader, tmp_path / "data").start()
    service = UnitService(host)
    try:
        listed = {u.unit_id: u for u in service.list(ListArgs()).units}
        assert listed["counter"].loaded and listed["counter"].test_capabilities == ["init"]
        inspected = service.inspect(UnitArgs(unit_id="counter"))
        assert [s.source_id for s in inspected.source_artifacts] == ["__init__.py", "panel.py", "test_init.py"]
    finally:
        host.close()
        loader.close()
    back = tmp_path / "back"
    back.mkdir()
    copied = run("-m", "unit_mcp.units", "copy", database, str(back))
    assert copied.returncode == 0, copied.stderr
    units = tmp_path / "units"  # what the database was copied from: the copy back has those files and no others
    expected = {path.relative_to(units) for path in units.rglob("*") if "__pycache__" not in path.parts}
    assert {path.relative_to(back) for path in back.rglob("*")} == expected


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


def test_a_read_with_max_bytes_refuses_a_bigger_source_without_fetching_it(database: str) -> None:
    loader = open_loader(database)
    data = loader.read(GREETER)
    assert loader.read(GREETER, max_bytes=len(data)) == data
    with pytest.raises(SourceTooLarge) as refused:
        loader.read(GREETER, max_bytes=len(data) - 1)
    assert refused.value.size == len(data)
    loader.close()


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


def replica_of(service: UnitService, unit_id: str) -> tuple[int | None, int | None, bool, str | None]:
    replica = service.inspect(unit_id).replica
    assert replica is not None
    return replica.served_version, replica.stored_version, replica.behind, replica.reload_error


def test_a_version_that_does_not_load_here_leaves_the_replica_behind_until_a_later_one_loads(
    replicas: list[UnitService], database: str
) -> None:
    first, second = replicas
    patched = first.apply_patch("greeter", "greeter.py", old="import logging\n", new="import logging\nMARK = 1\n")
    served, stored, behind, _ = replica_of(first, "greeter")
    assert served == stored and not behind and patched.hash == first.read_source("greeter", "greeter.py").hash
    wait_for(lambda: getattr(second.host.module("greeter"), "MARK", None) == 1, "the patch did not reach the replica")
    wait_for(lambda: replica_of(second, "greeter")[0] == stored, "the replica does not report the version it serves")
    listed = {u.unit_id: u.replica for u in second.list().units}
    assert listed["greeter"] is not None and listed["greeter"].served_version == stored

    source = first.loader.read(GREETER)
    sql(database, "UPDATE unit_mcp.sources SET data = %s WHERE unit_id = 'greeter'", (source + b"\nMARK = (\n",))
    for service in replicas:
        wait_for(lambda service=service: replica_of(service, "greeter")[3], "a failed version is not reported")
        served, stored, behind, error = replica_of(service, "greeter")
        assert behind and served is not None and stored is not None and served < stored
        assert error is not None and "SyntaxError" in error and "<units>/greeter.py" in error, error
        assert service.host.module("greeter").MARK == 1  # the old version serves
    sql(database, "UPDATE unit_mcp.sources SET data = %s WHERE unit_id = 'greeter'", (source + b"\nMARK = 2\n",))
    for service in replicas:
        wait_for(lambda service=service: getattr(service.host.module("greeter"), "MARK", None) == 2, "not caught up")
        wait_for(lambda service=service: not replica_of(service, "greeter")[2], "still reported behind")
        assert replica_of(service, "greeter")[3] is None


def terminate_listener(database: str, service: UnitService) -> int:
    """pg_terminate_backend on the replica's LISTEN connection; how many were ended."""
    name = f"unit-mcp-listen-{service.loader.writer}"  # type: ignore[attr-defined]
    rows = sql(database, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", (name,))
    return len(rows)


def test_a_listener_killed_during_a_burst_of_fifty_commits_misses_none(
    replicas: list[UnitService], database: str, caplog: pytest.LogCaptureFixture
) -> None:
    writer, reader = replicas
    writer.apply_patch("greeter", "greeter.py", old="import logging\n", new="import logging\nBURST = 0\n")
    wait_for(lambda: getattr(reader.host.module("greeter"), "BURST", None) == 0, "the replica did not load BURST")
    served: list[int] = []
    reader.host.unit_listeners.append(
        lambda unit_id: unit_id == "greeter" and served.append(reader.host.module("greeter").BURST)
    )
    terminated = []
    for n in range(1, 51):
        writer.apply_patch("greeter", "greeter.py", old=f"BURST = {n - 1}\n", new=f"BURST = {n}\n")
        if n in (10, 30):
            terminated.append(terminate_listener(database, reader))
    assert terminated[0] == 1
    wait_for(lambda: reader.host.module("greeter").BURST == 50, "the replica did not catch up with the burst")
    # the host tells its listeners once the reload has returned, a moment after the new module serves
    wait_for(lambda: served[-1:] == [50], f"the listener was not told of the caught-up version: {served}")
    assert served == sorted(served) and served[-1] == 50, served  # never an older version after a newer one
    assert "listening to the units database failed" in caplog.text
    wait_for(lambda: not replica_of(reader, "greeter")[2], "the replica reports itself behind")
    versions = reader.history("greeter", "greeter.py", limit=100).versions
    assert [v.tool_call for v in versions[:51]] == ["unit_apply_patch"] * 51


def test_an_outage_refuses_calls_at_once_and_the_replicas_catch_up(
    replicas: list[UnitService], pg_cluster: Cluster
) -> None:
    first, second = replicas
    read = first.read_source("greeter", "greeter.py")
    pg_cluster.stop()
    try:
        for call in (
            lambda: first.read_source("greeter", "greeter.py"),
            first.list,
            lambda: first.apply_patch("greeter", "greeter.py", old="Hello", new="Hi", expected_hash=read.hash),
            lambda: first.history("greeter", "greeter.py"),
        ):
            with pytest.raises(UnitError) as refused:
                call()
            assert refused.value.code == "store_unavailable", refused.value
            assert "reconnects by itself" in refused.value.hint and pg_cluster.url() not in str(refused.value)
        assert first.host.module("greeter") is not None  # still serving
    finally:
        pg_cluster.start()
    first.apply_patch("greeter", "greeter.py", old="import logging\n", new="import logging\nAFTER = 1\n")
    wait_for(lambda: getattr(second.host.module("greeter"), "AFTER", None) == 1, "the replica did not catch up")
    assert second.read_source("greeter", "greeter.py").hash == first.read_source("greeter", "greeter.py").hash


def test_a_writer_stuck_holding_the_row_gets_the_others_refused_not_hung(
    replicas: list[UnitService], database: str
) -> None:
    read = replicas[0].read_source("greeter", "greeter.py")
    with psycopg.connect(database) as stuck:  # a transaction left open holding the source's row
        stuck.execute("SELECT 1 FROM unit_mcp.sources WHERE unit_id = 'greeter' FOR UPDATE")
        with pytest.raises(UnitError) as refused:
            replicas[0].apply_patch("greeter", "greeter.py", old="Hello", new="Hi", expected_hash=read.hash)
        assert refused.value.code == "store_unavailable" and "lock timeout" in refused.value.message
    patched = replicas[0].apply_patch("greeter", "greeter.py", old="Hello", new="Hi", expected_hash=read.hash)
    assert patched.hash == replicas[0].read_source("greeter", "greeter.py").hash


def test_a_restart_during_a_burst_of_patches_loses_no_acknowledged_one(
    replicas: list[UnitService], pg_cluster: Cluster
) -> None:
    first = replicas[0]
    first.apply_patch("greeter", "greeter.py", old="import logging\n", new="import logging\nN = 0\n")
    acknowledged: list[str] = []
    refusals: list[str] = []
    done = threading.Event()

    def patch_until_done() -> None:
        n = 0
        while not done.is_set() or n < 20:
            n += 1
            try:
                current = first.read_source("greeter", "greeter.py")
                old = next(line for line in current.content.splitlines(keepends=True) if line.startswith("N = "))
                result = first.apply_patch(
                    "greeter", "greeter.py", old=old, new=f"N = {n}\n", expected_hash=current.hash
                )
                acknowledged.append(result.hash)
            except UnitError as exc:
                refusals.append(exc.code)
                time.sleep(0.05)

    patcher = threading.Thread(target=patch_until_done)
    patcher.start()
    wait_for(lambda: len(acknowledged) >= 5, "no patch went through before the restart")
    pg_cluster.restart()
    wait_for(lambda: len(acknowledged) >= 10 + len(refusals), "no patch went through after the restart")
    done.set()
    patcher.join(60)
    assert set(refusals) <= {"store_unavailable", "reload_failed"}, refusals
    history = {v.hash for v in first.history("greeter", "greeter.py", limit=1000).versions}
    assert set(acknowledged) <= history
    newest = first.read_source("greeter", "greeter.py")
    for service in replicas:
        wait_for(lambda service=service: service.read_source("greeter", "greeter.py").hash == newest.hash, "diverged")
        wait_for(lambda service=service: not replica_of(service, "greeter")[2], "a replica stays behind")
        content = newest.content
        assert f"N = {service.host.module('greeter').N}\n" in content


# -- real servers -------------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_three_servers_on_one_database_serve_a_patch_made_on_one(
    database: str, pg_cluster: Cluster, tmp_path: Path, anyio_backend: str
) -> None:
    from contextlib import AsyncExitStack

    import anyio
    from support.server_process import ServerProcess
    from test_sqlite_servers import connect, ok

    servers = [ServerProcess("--units", database, tmp=tmp_path, cold=True) for _ in range(3)]  # argv read in /proc
    try:
        printed = [server.ready() for server in servers]
        for server, lines in zip(servers, printed, strict=True):  # the password reaches them in PGPASSFILE only
            argv = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().decode()
            assert pg_cluster.password not in argv + str(lines) and database in argv
        async with AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(connect(p)) for p in printed]
            read = await ok(clients[0], "unit_read_source", unit_id="counter", source_id="__init__.py")
            patched = await ok(
                clients[0], "unit_apply_patch", unit_id="counter", source_id="__init__.py",
                old='return {"count": count}', new='return {"count": count, "patched": 1}', expected_hash=read["hash"],
            )  # fmt: skip
            for client in clients[1:]:
                deadline = time.monotonic() + 30
                while (await ok(client, "unit_snapshot", unit_id="counter"))["state"].get("patched") != 1:
                    assert time.monotonic() < deadline, "the patch was not served by another server"
                    await anyio.sleep(0.02)
                again = await ok(client, "unit_read_source", unit_id="counter", source_id="__init__.py")
                assert again["hash"] == patched["hash"]
                replica = (await ok(client, "unit_inspect", unit_id="counter"))["replica"]
                assert replica["served_version"] == replica["stored_version"] and not replica["behind"], replica
                listed = {u["unit_id"]: u for u in (await ok(client, "unit_list"))["units"]}
                assert listed["counter"]["replica"] == replica and listed["counter"]["loader"] == "postgres"
    finally:
        codes = [server.stop() for server in servers]
    assert codes == [0, 0, 0], [server.stderr() for server in servers]


def test_the_host_start_reads_every_unit_in_one_query_not_one_per_source(pg_cluster: Cluster, tmp_path: Path) -> None:
    folder = copy_units(tmp_path / "units")
    for n in range(200):
        (folder / f"many_{n:03d}.py").write_text(f"VALUE = {n}\n")
    database = postgres_copy(pg_cluster, folder)

    class Counting(PostgresLoader):
        queries = 0

        def _query(self, sql: str, args: tuple[object, ...] = ()) -> list[object]:
            Counting.queries += 1
            return super()._query(sql, args)

    loader = Counting(database)
    with Host(loader, tmp_path / "data") as host:
        assert Counting.queries < 10, Counting.queries  # discover and the sources: not one per unit
        assert host.module("many_199").VALUE == 199  # type: ignore[union-attr]
        assert host.module("counter").snapshot()["count"] == 0  # type: ignore[union-attr]  # a package's modules
        assert set(host.unit_kinds()) - {u for u in host.unit_kinds() if host.is_loaded(u)} == {"broken"}
    loader.close()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_two_servers_on_one_database_share_one_change_log(
    database: str, tmp_path: Path, anyio_backend: str
) -> None:
    """The change log lives in the database: a change made through one server is in the other's `unit_changes`,
    and a checkpoint taken on one is rolled back on the other (which reloads and serves it)."""
    from contextlib import AsyncExitStack

    import anyio
    from support.server_process import ServerProcess
    from test_sqlite_servers import connect, ok

    for n in range(2):
        (tmp_path / str(n)).mkdir()
    servers = [ServerProcess("--units", database, "--confirm", "none", tmp=tmp_path / str(n)) for n in range(2)]
    try:
        printed = [server.ready() for server in servers]
        async with AsyncExitStack() as stack:
            one, two = [await stack.enter_async_context(connect(p)) for p in printed]
            checkpoint = await ok(one, "unit_checkpoint", label="before the edit")
            patched = await ok(
                one, "unit_apply_patch", unit_id="counter", source_id="__init__.py",
                old='return {"count": count}', new='return {"count": count, "patched": 1}',
            )  # fmt: skip
            assert (await ok(one, "unit_snapshot", unit_id="counter"))["state"].get("patched") == 1
            [seen] = (await ok(two, "unit_changes", unit_id="counter"))["changes"]
            assert seen["change_id"] == patched["change_id"] and seen["outcome"] == "applied", seen
            assert seen["tool"] == "unit_apply_patch" and seen["sources"][0]["hash_after"] == patched["hash"]

            undone = await ok(two, "unit_rollback", checkpoint_id=checkpoint["checkpoint_id"])
            assert [(s["unit_id"], s["source_id"]) for s in undone["sources"]] == [("counter", "__init__.py")]
            deadline = time.monotonic() + 30
            while "patched" in (await ok(one, "unit_snapshot", unit_id="counter"))["state"]:
                assert time.monotonic() < deadline, "the first server does not serve the rolled back counter"
                await anyio.sleep(0.05)
            newest = (await ok(one, "unit_changes", limit=1))["changes"][0]
            assert newest["change_id"] == undone["change_id"] and newest["tool"] == "unit_rollback"
    finally:
        codes = [server.stop() for server in servers]
    assert codes == [0, 0], [server.stderr() for server in servers]
    rows = sql(database, "SELECT tool, outcome FROM unit_mcp.changes ORDER BY id")
    assert rows == [("unit_apply_patch", "applied"), ("unit_rollback", "applied")]  # once each, not per server
