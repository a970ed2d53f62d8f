"""How fast unit_run_tests(wait=false) answers (issue 24: p95 <= 50 ms), measured through the SDK's in-memory
client over a real host; the runs it starts are cancelled right after. Prints figures only.

    .venv/bin/python scripts/bench_long_calls.py [--calls 40]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client

from unit_mcp import Host, UnitService
from unit_mcp.tools import UnitTools


async def measure(calls: int) -> list[float]:
    with tempfile.TemporaryDirectory() as work:
        unit = Path(work) / "units" / "slow"
        unit.mkdir(parents=True)
        (unit / "__init__.py").write_text('"""A unit with a long test."""\n')
        (unit / "test_long.py").write_text("import time\n\n\ndef main():\n    time.sleep(60)\n")
        with Host(unit.parent, Path(work) / "data", namespace="bench_long_calls") as host:
            async with Client(UnitTools(UnitService(host)).server()) as client:
                times = []
                for _ in range(calls):
                    started = time.perf_counter()
                    result = await client.call_tool(
                        "unit_run_tests", {"unit_id": "slow", "test_name": "long", "wait": False}
                    )
                    times.append((time.perf_counter() - started) * 1000)
                    assert result.structured_content is not None, result.content
                    await client.call_tool("unit_cancel_test", {"run_id": result.structured_content["run_id"]})
                return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=40)
    times = sorted(anyio.run(measure, parser.parse_args().calls))
    p95 = times[max(0, round(0.95 * len(times)) - 1)]
    print(f"unit_run_tests(wait=false): median {statistics.median(times):.1f} ms, p95 {p95:.1f} ms, n {len(times)}")


if __name__ == "__main__":
    main()
