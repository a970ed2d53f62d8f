"""Load: 16 clients, each its own SDK session over Streamable HTTP, send a mix of reads and edits to
`python -m unit_mcp.server` running as a real child process (watching its units, as users run it): 12,000 calls, or
as many as 60 s allow on a loaded machine.

Every edit is a read -> patch with expected_hash that moves a counter in a unit's source one step; a refusal
as stale is expected (four clients share each counter), anything else is an error. At the end each counter
must equal the number of edits that succeeded on it (no lost update), and the server's resident memory,
measured at rest after a warm-up and again at rest after the run, must not have grown by more than 10%.
The run is a number of calls, not a time: what the checks need is calls (a leak grows with them; contention and
lost updates show within the first seconds), and a fixed count checks alike on a quiet and a loaded machine (a
60 s run made 29,000 calls at a load of 1.6 and 4,600 at 9). 12,000 is what a 60 s run made at a load of 4.4: a
leak of about 1.1 KB a call (10% of the 134 MB) fails the bound. `UNIT_MCP_LOAD_CALLS` and `UNIT_MCP_LOAD_SECONDS`
(the cap) change the run for local experiments; the report records what was run.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.load_mix import (
    EDIT,
    KINDS,
    TALLIES,
    copy_units,
    cpu_seconds,
    home_of,
    next_call,
    read_tally,
    rss_kib,
    tally_count,
    tally_patch,
)
from support.server_process import ServerProcess

from .clients import call, connect
from .report import Report

pytestmark = pytest.mark.anyio

CLIENTS = 16
WARM_UP = 5.0
CALLS = int(os.environ.get("UNIT_MCP_LOAD_CALLS", "12000"))  # the measured run ends after this many calls
SECONDS = float(os.environ.get("UNIT_MCP_LOAD_SECONDS", "60"))  # or after this long, whichever comes first


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


class Tally:
    """What the clients saw, by operation."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.errors: list[str] = []
        self.stale = 0
        self.run_successes = 0
        self.successes: collections.Counter[str] = collections.Counter()
        self.latency: dict[str, list[float]] = collections.defaultdict(list)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    units = tmp_path / "units"
    copy_units(units)
    process = ServerProcess("--units", str(units), "--data-dir", str(tmp_path / "data"), tmp=tmp_path)
    yield process
    process.kill()


async def test_sixteen_clients_for_12000_calls(server: ServerProcess, tmp_path: Path, figures: Report) -> None:
    printed = server.ready()
    url, token, pid = printed["MCP_URL"], printed["MCP_TOKEN"], server.proc.pid
    tally = Tally()
    phase: dict[str, Any] = {"name": "warm-up", "until": 0.0}
    arrived = {"count": 0}
    at_rest = anyio.Event()
    resume = anyio.Event()
    finished = anyio.Event()
    enough = anyio.Event()  # the measured run made CALLS calls

    async def timed(name: str, arguments: dict[str, object], client: object) -> object:
        started = time.perf_counter()
        result = await call(client, name, arguments)  # type: ignore[arg-type]
        if phase["name"] == "run":
            tally.calls[name] += 1
            tally.latency[name].append(time.perf_counter() - started)
            if not enough.is_set() and sum(tally.calls.values()) >= CALLS:
                phase["until"] = time.monotonic()  # no client starts another step; the ones under way finish
                enough.set()
        return result

    async def increment(client: object, unit: str) -> None:
        read = await timed("unit_read_source", read_tally(unit), client)
        assert read.structured is not None, read.text  # type: ignore[attr-defined]
        result = await timed("unit_apply_patch", tally_patch(unit, read.structured), client)  # type: ignore[attr-defined]
        if not result.is_error:  # type: ignore[attr-defined]
            tally.successes[unit] += 1
            tally.run_successes += phase["name"] == "run"
        elif result.code == "stale_hash":  # type: ignore[attr-defined]
            tally.stale += phase["name"] == "run"
        else:
            tally.errors.append(f"apply_patch: {result.text[:200]}")  # type: ignore[attr-defined]

    async def one_step(client: object, rng: random.Random, home: str, draw: float | None = None) -> None:
        name, arguments = next_call(rng, home, draw)
        if name == EDIT:
            await increment(client, home)
            return
        result = await timed(name, arguments, client)
        if result.is_error:  # type: ignore[attr-defined]
            tally.errors.append(f"{name}: {result.text[:200]}")  # type: ignore[attr-defined]

    async def client_task(number: int) -> None:
        rng, home = random.Random(number), home_of(number)
        async with connect(url, token) as client:
            if number == 0:  # every kind once before memory is measured: what a first call loads (resolve's model)
                for draw in KINDS.values():  # is not growth, whether or not a loaded machine's warm-up drew it
                    await one_step(client, rng, home, draw)
            for gate in (resume, finished):  # the warm-up, then the measured run; both end at rest
                while time.monotonic() < phase["until"]:
                    try:
                        await one_step(client, rng, home)
                    except Exception as exc:  # a protocol error or a broken connection is an error too
                        tally.errors.append(f"{type(exc).__name__}: {exc}"[:200])
                arrived["count"] += 1
                if arrived["count"] == CLIENTS:
                    at_rest.set()
                await gate.wait()

    samples: list[int] = []
    async with anyio.create_task_group() as group:
        phase["until"] = time.monotonic() + WARM_UP
        for number in range(CLIENTS):
            group.start_soon(client_task, number)
        await at_rest.wait()
        await anyio.sleep(0.5)
        rss_before = rss_kib(pid)
        at_rest = anyio.Event()
        arrived["count"] = 0
        phase.update(name="run", until=time.monotonic() + SECONDS)
        started, server_cpu, own_cpu = time.perf_counter(), cpu_seconds(pid), time.process_time()
        resume.set()
        while time.monotonic() < phase["until"]:
            with anyio.move_on_after(min(5.0, max(0.0, phase["until"] - time.monotonic()))):
                await enough.wait()
            samples.append(rss_kib(pid))
        await at_rest.wait()
        elapsed = time.perf_counter() - started
        server_cpu, own_cpu = cpu_seconds(pid) - server_cpu, time.process_time() - own_cpu
        await anyio.sleep(0.5)
        rss_after = rss_kib(pid)
        # Every counter equals the edits that succeeded on it, as the server reads it and as the disk holds it.
        async with connect(url, token) as checker:
            counts = {}
            for number in range(TALLIES):
                unit = f"tally{number}"
                read = await call(checker, "unit_read_source", read_tally(unit))
                assert read.structured is not None
                counts[unit] = tally_count(read.structured["content"])
                snapshot = await call(checker, "unit_snapshot", {"unit_id": unit})
                assert snapshot.structured and snapshot.structured["state"] == {"count": counts[unit]}, "and runs it"
        finished.set()

    assert server.proc.poll() is None, "the server is still up"
    total = sum(tally.calls.values())
    lost = {unit: tally.successes[unit] - counts[unit] for unit in counts}
    growth = (rss_after - rss_before) / rss_before
    figures.record(
        "load",
        clients=CLIENTS,
        calls_target=CALLS,
        seconds_cap=SECONDS,
        seconds=round(elapsed, 1),
        warm_up_seconds=WARM_UP,
        calls=total,
        calls_per_second=round(total / elapsed, 1),
        by_tool=dict(tally.calls.most_common()),
        errors=len(tally.errors),
        stale_refusals=tally.stale,
        successful_edits=tally.run_successes,
        successful_edits_including_warm_up=sum(tally.successes.values()),
        lost_updates=sum(abs(value) for value in lost.values()),
        final_counters=counts,
        latency_ms={
            name: {
                "p50": round(statistics.median(values) * 1000, 1),
                "p95": round(percentile(values, 0.95) * 1000, 1),
                "p99": round(percentile(values, 0.99) * 1000, 1),
            }
            for name, values in sorted(tally.latency.items())
        },
        server_cpu_percent=round(100 * server_cpu / elapsed),
        clients_cpu_percent=round(100 * own_cpu / elapsed),
        server_cpu_ms_per_call=round(1000 * server_cpu / max(total, 1), 2),
        rss_kib_before=rss_before,
        rss_kib_after=rss_after,
        rss_growth_percent=round(growth * 100, 1),
        rss_kib_peak_during_run=max(samples, default=rss_after),
        server="python -m unit_mcp.server (child process, watching its units)",
        machine_load_average=round(os.getloadavg()[0], 1),
    )
    assert tally.errors == [], f"{len(tally.errors)} errors, e.g. {tally.errors[:5]}"
    assert all(value == 0 for value in lost.values()), f"lost updates: {lost}"
    assert tally.stale > 0, "the clients must have contended for the counters"
    assert growth <= 0.10, f"resident memory grew {growth:.1%}: {rss_before} -> {rss_after} KiB"
    assert server.stop(signal.SIGTERM) == 0
