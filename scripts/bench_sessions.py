#!/usr/bin/env python3
"""Benchmark: the median cost of appending one item to an agent session with 10 and with 10,000 items.

The session journal is append-only, so the cost should not depend on the history length (a ratio near 1).
Measured for each durability policy (`always` fsyncs every record; `flush` only at flush points).
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


if __name__ == "__main__":
    main()
