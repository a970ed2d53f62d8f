"""Benchmarks of issue 16's warm test runs and host start-up, reusing `bench.py`'s helpers; prints figures only.

    .venv/bin/python scripts/bench_testrun.py                 # both
    .venv/bin/python scripts/bench_testrun.py --only tests    # unit_run_tests(trivial) / python -c pass
    .venv/bin/python scripts/bench_testrun.py --only start    # host start with 10,000 units, folder and SQLite

Nothing is asserted; the two sides of the ratio are interleaved call by call in the same run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from bench import interleaved, make_units, ratio_row, summary
from unit_mcp import Host, UnitService
from unit_mcp.loader import open_loader
from unit_mcp.testrun import WARM, run_test_process


async def tests(work: Path, rounds: int) -> None:
    root = work / "tests-units"
    (root / "trivial").mkdir(parents=True)
    (root / "trivial" / "__init__.py").write_text("")
    (root / "trivial" / "test_init.py").write_text("def main():\n    return True\n")
    with Host(root, work / "tests-data", namespace="bench_tests") as host:
        service = UnitService(host)

        def cold() -> None:
            run_test_process(root, "bench_tests", "trivial", "init", timeout=60, cwd=host.data_dir, warm=False)

        samples = await interleaved(
            {
                "unit_run_tests_trivial": lambda: anyio.to_thread.run_sync(lambda: service.run_tests("trivial")),
                "python_c_pass": lambda: anyio.run_process([sys.executable, "-c", "pass"]),
                "cold_test_process": lambda: anyio.to_thread.run_sync(cold),
            },
            rounds,
            warmup=2,
        )
    figures = {k: summary(v) for k, v in samples.items()}
    print("## tests", figures, sep="\n")
    row = ratio_row(
        "unit_run_tests(trivial) / python -c pass", figures["unit_run_tests_trivial"], figures["python_c_pass"], 1.5
    )
    print(row)
    print(
        ratio_row(
            "cold test process (before) / python -c pass", figures["cold_test_process"], figures["python_c_pass"], 1.5
        )
    )


def start(work: Path, count: int, repeats: int) -> None:
    folder = work / f"start-{count}"
    make_units(folder, count, body="def total(items):\n    return sum(items)\n")
    database = f"sqlite:{work / 'start.db'}"
    loader = open_loader(database)
    for unit in sorted(folder.iterdir()):
        loader.put_unit(unit.stem, "file", {unit.name: unit.read_bytes()}, replace=False)
    loader.close()
    figures: dict[str, Any] = {}
    for name, units in (("folder", str(folder)), ("sqlite", database)):
        times = []
        for n in range(repeats):
            host = Host(units, work / f"start-data-{name}-{n}", namespace=f"bench_start_{name}")
            started = time.perf_counter()
            host.start()
            times.append((time.perf_counter() - started) * 1000)
            listed = len(UnitService(host).list().units)
            host.close()
            assert listed == count, listed
        figures[f"host_start_{count}_units_{name}"] = summary(times)
    print("## start", figures, sep="\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("tests", "start"))
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--units", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="unit-mcp-bench-") as tmp:
        if args.only in (None, "tests"):
            anyio.run(tests, Path(tmp), args.rounds)
            WARM.stop()
        if args.only in (None, "start"):
            start(Path(tmp), args.units, 3)


if __name__ == "__main__":
    main()
