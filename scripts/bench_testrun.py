"""Benchmarks of issue 16's warm test runs and host start-up, reusing `bench.py`'s helpers; prints figures only.

    .venv/bin/python scripts/bench_testrun.py                 # both
    .venv/bin/python scripts/bench_testrun.py --only tests    # unit_run_tests(trivial) / python -c pass
    .venv/bin/python scripts/bench_testrun.py --only start    # host start with 10,000 units, folder and SQLite
    .venv/bin/python scripts/bench_testrun.py --only write    # where a folder patch + reload spends its time

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
from unit_mcp.testrun import WARM, run_test_process
from unit_mcp.units import open_loader


async def tests(work: Path, rounds: int) -> None:
    root = work / "tests-units"
    (root / "trivial").mkdir(parents=True)
    (root / "trivial" / "__init__.py").write_text("")
    (root / "trivial" / "test_init.py").write_text("def main():\n    return True\n")
    with Host(root, work / "tests-data", namespace="bench_tests") as host:
        service = UnitService(host)

        def cold() -> None:
            run_test_process(root, "bench_tests", "trivial", "init", timeout=60, warm=False)

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


def write(work: Path, rounds: int) -> None:
    """Where a folder patch+reload's time goes: each phase timed inside the real `apply_patch` by wrapping it."""
    import logging
    import os
    import statistics
    from collections import defaultdict

    from unit_mcp import paths

    root = work / "write-units"
    (root / "edited").mkdir(parents=True)
    body = "".join(f"def f{k}(x):\n    return x * {k}\n\n" for k in range(40))
    (root / "edited" / "__init__.py").write_text("VERSION = 0\n" + body)
    spent: dict[str, list[float]] = defaultdict(list)
    current: dict[str, float] = defaultdict(float)

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                current[name] += (time.perf_counter() - started) * 1000

        return wrapper

    with Host(root, work / "write-data", namespace="bench_write") as host:
        service = UnitService(host)
        loader = host.loader
        loader.write = timed("loader.write (hash check, temp file, fsync, rename)", loader.write)  # type: ignore[method-assign]
        host._reload = timed("host reload (drop, import, init, log line)", host._reload)  # type: ignore[method-assign]
        service.compile = timed("syntax check (compile)", service.compile)  # type: ignore[method-assign]
        handler = host._log_handler
        assert handler is not None
        handler.handle = timed("app log line (format, write)", handler.handle)  # type: ignore[method-assign]
        real_fsync = os.fsync
        os.fsync = timed("  of which fsync of the file", real_fsync)
        try:
            for n in range(rounds + 5):
                current.clear()
                started = time.perf_counter()
                service.apply_patch("edited", "__init__.py", old=f"VERSION = {n}\n", new=f"VERSION = {n + 1}\n")
                current["apply_patch total"] = (time.perf_counter() - started) * 1000
                if n >= 5:
                    for name, value in current.items():
                        spent[name].append(value)
            for _ in range(rounds):  # the same write without fsync, for scale (not what the loader does)
                data = paths.read_bytes(root, ["edited", "__init__.py"])
                started = time.perf_counter()
                with open(root / "edited" / ".scratch", "wb") as handle:
                    handle.write(data)
                os.replace(root / "edited" / ".scratch", root / "edited" / ".scratch2")
                spent["(for scale) same bytes written + renamed, no fsync"].append(
                    (time.perf_counter() - started) * 1000
                )
        finally:
            os.fsync = real_fsync
            logging.getLogger("unit_mcp").handlers.clear()
    print("## write + reload, folder loader, medians in ms")
    for name, values in spent.items():
        print(f"  {name}: {statistics.median(values):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("tests", "start", "write"))
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--units", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="unit-mcp-bench-") as tmp:
        if args.only in (None, "tests"):
            anyio.run(tests, Path(tmp), args.rounds)
            WARM.stop()
        if args.only in (None, "start"):
            start(Path(tmp), args.units, 3)
        if args.only in (None, "write"):
            write(Path(tmp), args.rounds)


if __name__ == "__main__":
    main()
