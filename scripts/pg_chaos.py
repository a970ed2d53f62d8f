"""A bounded, seeded fault run (Jepsen-style) over three `unit_mcp.server` replicas on one PostgreSQL database.

    .venv/bin/python scripts/pg_chaos.py --seed 7 --seconds 60

Clients read a source and patch it with its expected hash on random replicas while a nemesis, at random moments,
ends replicas' LISTEN connections (pg_terminate_backend), restarts the cluster (pg_ctl restart) and SIGKILLs a
replica and starts a new one. Then the faults stop and a checker proves, from the clients' own records and the
history: every acknowledged write is in the history exactly once; the history is one chain (each version was
written on the one before it); no replica process ever served an older version after a newer one; every replica
ends serving the newest version or reporting itself behind with the reason. Exit status 1 when a check fails.
The same seed gives the same schedule of operations and faults (their timing on a shared machine varies).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import psycopg

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from support.pgcluster import Cluster  # noqa: E402
from support.server_process import ServerProcess  # noqa: E402
from test_sqlite_servers import connect  # noqa: E402

from unit_mcp.loader import Source  # noqa: E402
from unit_mcp.paths import hash_bytes  # noqa: E402
from unit_mcp.units import copy_units, open_loader  # noqa: E402

UNIT = {"unit_id": "chain", "source_id": "chain.py"}
BODY = 'N = "start"\n\n\ndef snapshot():\n    return {"n": N}\n'


class Run:
    def __init__(self, seed: int, seconds: float, work: Path, cluster: Cluster, database: str) -> None:
        self.random = random.Random(seed)
        self.seconds = seconds
        self.work = work
        self.cluster = cluster
        self.database = database
        self.replicas: list[tuple[ServerProcess, dict[str, str]]] = []
        self.attempts: dict[str, str] = {}  # new hash -> base hash, for every patch sent
        self.acknowledged: list[str] = []
        self.outcomes: dict[str, int] = {}
        self.served: dict[int, list[int]] = {}  # replica pid -> served versions, in the order seen
        self.faults: dict[str, int] = {"listener_killed": 0, "cluster_restarted": 0, "replica_killed": 0}

    def start_replica(self) -> tuple[ServerProcess, dict[str, str]]:
        process = ServerProcess("--units", self.database, tmp=self.work)
        return process, process.ready(60)

    async def call(self, index: int, name: str, **arguments: Any) -> tuple[str, dict[str, Any]]:
        """One tool call on a fresh connection (a replica may be killed at any moment): (outcome, result)."""
        printed = self.replicas[index][1]
        try:
            with anyio.fail_after(20):
                async with connect(printed) as client:
                    result = await client.call_tool(name, arguments)
        except Exception:
            return "no_answer", {}
        if result.is_error:
            return str((result.meta or {}).get("unit_mcp/error", {}).get("code", "error")), {}
        return "ok", dict(result.structured_content or {})

    async def client(self, number: int, deadline: float) -> None:
        op = 0
        while time.monotonic() < deadline:
            op += 1
            index = self.random.randrange(len(self.replicas))
            outcome, read = await self.call(index, "unit_read_source", **UNIT)
            if outcome == "ok":
                old = next(line for line in read["content"].splitlines(keepends=True) if line.startswith("N = "))
                new = f'N = "c{number}-{op}"\n'
                new_hash = hash_bytes(read["content"].replace(old, new).encode())
                self.attempts[new_hash] = read["hash"]
                index = self.random.randrange(len(self.replicas))
                outcome, done = await self.call(
                    index, "unit_apply_patch", **UNIT, old=old, new=new, expected_hash=read["hash"]
                )
                if outcome == "ok":
                    assert done["hash"] == new_hash
                    self.acknowledged.append(new_hash)
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            await anyio.sleep(self.random.uniform(0, 0.05))

    async def observer(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            for index in range(len(self.replicas)):
                process = self.replicas[index][0]
                outcome, inspected = await self.call(index, "unit_inspect", unit_id=UNIT["unit_id"])
                served = (inspected.get("replica") or {}).get("served_version") if outcome == "ok" else None
                if served is not None:
                    self.served.setdefault(process.proc.pid, []).append(served)
            await anyio.sleep(0.05)

    async def nemesis(self, deadline: float) -> None:
        while True:
            await anyio.sleep(self.random.uniform(1, 4))
            if time.monotonic() >= deadline:
                return
            fault = self.random.choice(sorted(self.faults))
            if fault == "listener_killed":
                with psycopg.connect(self.database, autocommit=True) as conn:
                    conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name LIKE 'unit-mcp-listen-%' ORDER BY random() LIMIT 1"
                    )
            elif fault == "cluster_restarted":
                await anyio.to_thread.run_sync(self.cluster.restart)
            else:
                index = self.random.randrange(len(self.replicas))
                self.replicas[index][0].kill()
                self.replicas[index] = await anyio.to_thread.run_sync(self.start_replica)
            self.faults[fault] += 1

    async def run(self) -> dict[str, Any]:
        self.replicas = [await anyio.to_thread.run_sync(self.start_replica) for _ in range(3)]
        try:
            deadline = time.monotonic() + self.seconds
            async with anyio.create_task_group() as group:
                for number in range(4):
                    group.start_soon(self.client, number, deadline)
                group.start_soon(self.observer, deadline)
                group.start_soon(self.nemesis, deadline)
            return await self.check()
        finally:
            for process, _ in self.replicas:
                process.kill()

    async def check(self) -> dict[str, Any]:
        loader = open_loader(self.database)
        history = list(reversed(loader.history(Source("chain", "file", "chain.py"), 100_000)))
        newest = history[-1].version
        final: list[dict[str, Any]] = []
        settle = time.monotonic() + 30  # the faults have stopped: each replica converges or says why not
        for index in range(len(self.replicas)):
            while True:
                outcome, inspected = await self.call(index, "unit_inspect", unit_id="chain")
                replica = inspected.get("replica") or {}
                done = replica.get("served_version") == newest or replica.get("reload_error")
                if (outcome == "ok" and done) or time.monotonic() > settle:
                    final.append(replica)
                    break
                await anyio.sleep(0.1)
        loader.close()
        hashes = [v.hash for v in history]
        failures = []
        for acked in self.acknowledged:
            if hashes.count(acked) != 1:
                failures.append(f"acknowledged write {acked[:19]} is in the history {hashes.count(acked)} times")
        for before, after in itertools.pairwise(history):
            if self.attempts.get(after.hash) != before.hash:
                failures.append(f"version {after.version} was not written on version {before.version}")
        for pid, seen in self.served.items():
            if seen != sorted(seen):
                failures.append(f"replica {pid} served an older version after a newer one: {seen}")
        for replica in final:
            if replica.get("served_version") != newest and not replica.get("reload_error"):
                failures.append(f"a replica ends neither at version {newest} nor behind with a reason: {replica}")
        return {
            "acknowledged": len(self.acknowledged),
            "history_versions": len(history),
            "outcomes": self.outcomes,
            "faults": self.faults,
            "replica_processes_observed": len(self.served),
            "failures": failures,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()
    cluster = Cluster()
    try:
        cluster.start()
        os.environ["PGPASSFILE"] = str(cluster.passfile)
        with tempfile.TemporaryDirectory(prefix="unit-mcp-chaos-") as tmp:
            folder = Path(tmp) / "units"
            folder.mkdir()
            (folder / "chain.py").write_text(BODY)
            database = cluster.new_database()
            target = open_loader(database)
            copy_units(open_loader(folder, read_only=True), target)
            target.close()
            result = anyio.run(Run(args.seed, args.seconds, Path(tmp), cluster, database).run)
    finally:
        cluster.close()
    print(json.dumps({"seed": args.seed, "seconds": args.seconds, **result}, indent=2))
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
