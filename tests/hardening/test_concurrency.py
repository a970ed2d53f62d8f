"""Concurrent edits over HTTP, each from its own client session: of 50 patches carrying one expected_hash exactly
one wins and the file is its result; patches to different units, or to different files of one unit, all land."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import anyio
import pytest

from .clients import call, connect
from .conftest import Served
from .report import Report
from .rpc import ToolOutcome

pytestmark = pytest.mark.anyio

CONTENDERS = 50


async def test_fifty_patches_with_one_expected_hash_one_wins(served: Served, units_root: Path, figures: Report) -> None:
    target = units_root / "counter" / "__init__.py"
    async with connect(served.url, served.token) as reader:
        read = await call(reader, "unit_read_source", {"unit_id": "counter", "source_id": "__init__.py"})
    assert read.structured is not None
    expected = read.structured["hash"]
    results: dict[int, ToolOutcome] = {}
    connected = 0
    go = anyio.Event()

    async def contender(value: int) -> None:
        nonlocal connected
        async with connect(served.url, served.token) as client:
            connected += 1
            if connected == CONTENDERS:
                go.set()
            await go.wait()
            arguments = {"unit_id": "counter", "source_id": "__init__.py", "old": "step = 1", "new": f"step = {value}"}
            results[value] = await call(client, "unit_apply_patch", {**arguments, "expected_hash": expected})

    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for value in range(100, 100 + CONTENDERS):
            group.start_soon(contender, value)
    elapsed = time.perf_counter() - started

    winners = [value for value, result in results.items() if not result.is_error]
    losers = [result for result in results.values() if result.is_error]
    assert len(results) == CONTENDERS and len(winners) == 1, [r.text[:200] for r in results.values()]
    assert [result.code for result in losers] == ["stale_hash"] * (CONTENDERS - 1)
    won = results[winners[0]].structured
    assert won is not None and won["reload"]["reloaded"]
    data = target.read_bytes()
    assert "sha256:" + hashlib.sha256(data).hexdigest() == won["hash"], "the file is the winner's result"
    assert f"step = {winners[0]}\n" in data.decode() and data.decode().count("step = ") == 1
    assert served.host.module("counter").step == winners[0], "and the winner's version is the one running"
    for loser in losers:
        details = loser.raw["_meta"]["unit_mcp/error"]["details"]
        assert details == {"expected_hash": expected, "current_hash": won["hash"]}
    figures.record(
        "concurrency",
        same_hash_contenders=CONTENDERS,
        client_sessions=CONTENDERS,
        winners=len(winners),
        refused_stale_hash=len(losers),
        other_outcomes=CONTENDERS - len(winners) - len(losers),
        file_equals_winner=True,
        same_hash_seconds=round(elapsed, 2),
    )


async def test_concurrent_patches_to_different_units_all_land(
    served: Served, units_root: Path, figures: Report
) -> None:
    lanes, rounds = 8, 10
    for lane in range(lanes):
        (units_root / f"lane{lane}.py").write_text(f'"""Lane {lane}."""\n\nVALUE = 0\n')

    async def worker(lane: int) -> None:
        unit, source = f"lane{lane}", f"lane{lane}.py"
        async with connect(served.url, served.token) as client:
            for value in range(rounds):
                read = await call(client, "unit_read_source", {"unit_id": unit, "source_id": source})
                assert read.structured is not None
                edit = await call(
                    client,
                    "unit_apply_patch",
                    {
                        "unit_id": unit,
                        "source_id": source,
                        "old": f"VALUE = {value}\n",
                        "new": f"VALUE = {value + 1}\n",
                        "expected_hash": read.structured["hash"],
                    },
                )
                assert not edit.is_error, edit.text

    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for lane in range(lanes):
            group.start_soon(worker, lane)
    elapsed = time.perf_counter() - started
    for lane in range(lanes):
        assert (units_root / f"lane{lane}.py").read_text().endswith(f"VALUE = {rounds}\n")
        assert rounds == served.host.module(f"lane{lane}").VALUE

    # Ten files of one unit, patched at once: the unit's lock serialises them, and every one lands.
    files = 10
    for number in range(files):
        (units_root / "counter" / f"part{number}.txt").write_text(f"part {number}: old\n")
    async with connect(served.url, served.token) as client:
        reads = [
            await call(client, "unit_read_source", {"unit_id": "counter", "source_id": f"part{n}.txt"})
            for n in range(files)
        ]
        outcomes: list[ToolOutcome] = []

        async def edit(number: int) -> None:
            structured = reads[number].structured
            assert structured is not None
            arguments = {"unit_id": "counter", "source_id": f"part{number}.txt", "old": "old", "new": "new"}
            outcomes.append(await call(client, "unit_apply_patch", {**arguments, "expected_hash": structured["hash"]}))

        async with anyio.create_task_group() as group:
            for number in range(files):
                group.start_soon(edit, number)
    assert [outcome.is_error for outcome in outcomes] == [False] * files, [o.text[:200] for o in outcomes]
    for number in range(files):
        assert (units_root / "counter" / f"part{number}.txt").read_text() == f"part {number}: new\n"
    figures.record(
        "concurrency",
        different_units=lanes,
        patches_per_unit=rounds,
        different_unit_patches_landed=lanes * rounds,
        different_units_seconds=round(elapsed, 2),
        files_of_one_unit_patched_at_once=files,
        files_of_one_unit_landed=files,
    )


async def test_twenty_creates_of_one_new_file_one_wins(served: Served, units_root: Path, figures: Report) -> None:
    results: dict[int, ToolOutcome] = {}
    connected = 0
    go = anyio.Event()

    async def creator(value: int) -> None:
        nonlocal connected
        async with connect(served.url, served.token) as client:
            connected += 1
            if connected == 20:
                go.set()
            await go.wait()
            arguments = {"unit_id": "counter", "source_id": "racy/new.py", "source": f"WINNER = {value}\n"}
            results[value] = await call(client, "unit_create_source", arguments)

    async with anyio.create_task_group() as group:
        for value in range(20):
            group.start_soon(creator, value)
    winners = [value for value, result in results.items() if not result.is_error]
    assert len(winners) == 1, [result.text[:200] for result in results.values()]
    assert sorted(result.code or "" for result in results.values() if result.is_error) == ["exists"] * 19
    assert (units_root / "counter" / "racy" / "new.py").read_text() == f"WINNER = {winners[0]}\n"
    assert sorted(path.name for path in (units_root / "counter" / "racy").iterdir()) == ["new.py"], "no leftovers"
    figures.record("concurrency", same_new_file_creators=20, create_winners=1, refused_exists=19)
