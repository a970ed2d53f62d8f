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


def paging_ms(small: Path | str, big: Path | str, limit: int = 10, repeats: int = 51) -> dict[str, float]:
    """Median time (ms) of listing a page of `limit` sessions (newest first, as the page and the CLI do): the one
    page of a store of 10 sessions, and the first and the last page (reached by its cursor) of a store of 10,000;
    the three interleaved call by call, so that the machine's drift hits them alike."""
    readers = []
    for root, sessions in ((small, 10), (big, 10_000)):
        store = SessionStore(root, durability="never")
        for n in range(sessions):
            store.create("bench", title=f"session {n}")
        store.close()
        readers.append(SessionStore(root, read_only=True))
    cursor = None
    while (listed := readers[1].page(limit, cursor)).next is not None:
        cursor = listed.next
    sides = {"of_10": (readers[0], None), "first_of_10000": (readers[1], None), "last_of_10000": (readers[1], cursor)}
    costs: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, (reader, after) in sides.items():
            started = time.perf_counter_ns()
            reader.page(limit, after)
            costs[name].append((time.perf_counter_ns() - started) / 1e6)
    for reader in readers:
        reader.close()
    return {name: statistics.median(samples) for name, samples in costs.items()}


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
        pages = paging_ms(Path(small), Path(big))
    print("a page of 10 sessions (ms): " + ", ".join(f"{name} {value:.3f}" for name, value in pages.items()))


if __name__ == "__main__":
    main()
