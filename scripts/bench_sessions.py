#!/usr/bin/env python3
"""Benchmark: the median cost of appending one item to an agent session with 10 and with 10,000 items, of
loading a 10,000-item session, and of listing a store of 10,000 sessions against one of 10.

An append is one SQLite transaction, so its cost should not depend on the history length (a ratio near 1).
Measured for each durability policy (`always`: synchronous FULL; `flush`: NORMAL, FULL at flush points).
Printed, not asserted:  .venv/bin/python scripts/bench_sessions.py [--appends N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from unit_mcp.agent import SessionStore
from unit_mcp.agent.items import MessageItem
from unit_mcp.agent.sessions import Durability

SIZES = (10, 10_000)
CONTENT = "a typical message of a few dozen words " * 4


def median_append_us(root: Path, history: int, durability: Durability, appends: int) -> tuple[float, float]:
    """Median and 90th percentile of one append (µs) to a session that already holds `history` items."""
    filler = SessionStore(root, durability="never")
    session = filler.create("bench")
    for n in range(history):
        filler.append_item(session, MessageItem(role="user", content=f"{n} {CONTENT}"))
    filler.close()

    store = SessionStore(root, durability=durability)
    store.require(session.id)  # load (replay) outside the measurement
    costs = []
    for n in range(appends):
        item = MessageItem(role="assistant", content=f"{n} {CONTENT}")
        started = time.perf_counter_ns()
        store.append_item(session.id, item)
        costs.append((time.perf_counter_ns() - started) / 1000)
    store.close()
    return statistics.median(costs), statistics.quantiles(costs, n=10)[-1]


def load_ms(root: Path | str, history: int, repeats: int = 5) -> tuple[float, float]:
    """Median time and CPU time of this process (ms) a fresh store (a folder or a postgresql:// address) takes to
    load a session of `history` items (the CPU time is what a busy machine does not inflate)."""
    filler = SessionStore(root, durability="never")
    session = filler.create("bench")
    for n in range(history):
        filler.append_item(session, MessageItem(role="user", content=f"{n} {CONTENT}"))
    filler.close()
    costs, cpu = [], []
    for _ in range(repeats):
        store = SessionStore(root)
        started, started_cpu = time.perf_counter_ns(), time.process_time_ns()
        store.require(session.id)
        costs.append((time.perf_counter_ns() - started) / 1e6)
        cpu.append((time.process_time_ns() - started_cpu) / 1e6)
        store.close()
    return statistics.median(costs), statistics.median(cpu)


def list_ms(root: Path | str, sessions: int, repeats: int = 5) -> float:
    """Median time (ms) of the first page (50, newest first: what the page and the CLI show) of a store holding
    `sessions` sessions."""
    store = SessionStore(root, durability="never")
    for n in range(sessions):
        store.create("bench", title=f"session {n}")
    store.close()
    reader = SessionStore(root, read_only=True)
    costs = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        reader.page(50)
        costs.append((time.perf_counter_ns() - started) / 1e6)
    reader.close()
    return statistics.median(costs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appends", type=int, default=300, help="appends measured per size (default 300)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary folder)")
    args = parser.parse_args()
    print(f"median cost of one append, {args.appends} appends per size ({len(CONTENT) + 6}-character messages)")
    print(f"{'durability':<10} {'items':>7} {'median µs':>10} {'p90 µs':>9}")
    for durability in ("always", "flush"):
        medians = {}
        for size in SIZES:
            with tempfile.TemporaryDirectory(dir=args.dir) as root:
                median, p90 = median_append_us(Path(root), size, durability, args.appends)
            medians[size] = median
            print(f"{durability:<10} {size:>7} {median:>10.1f} {p90:>9.1f}")
        ratio = medians[SIZES[-1]] / medians[SIZES[0]]
        print(f"{durability:<10} ratio {SIZES[-1]:,} / {SIZES[0]} items: {ratio:.2f}")
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        wall, cpu = load_ms(Path(root), 10_000)
        print(f"load a 10,000-item session: {wall:.1f} ms ({cpu:.1f} ms of CPU)")
    with tempfile.TemporaryDirectory(dir=args.dir) as small, tempfile.TemporaryDirectory(dir=args.dir) as big:
        few, many = list_ms(Path(small), 10), list_ms(Path(big), 10_000)
    print(f"list 10 sessions: {few:.2f} ms, 10,000 sessions: {many:.1f} ms (ratio {many / few:.0f})")


if __name__ == "__main__":
    main()
