"""unit_resolve on paraphrased descriptions (issue 24): top-1 and top-3 on the held-out set (no word in common with
any unit's facts, so only the fallback ranking can help) and on the older paraphrase set; prints figures only.

    .venv/bin/python scripts/bench_resolve.py
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from unit_mcp import Host, UnitService

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "resolve"


def score(service: UnitService, queries: list[tuple[str, str]]) -> tuple[float, float, int]:
    """(top-1, top-3, answers with no candidate) over `queries`."""
    top1 = top3 = empty = 0
    for description, meant in queries:
        found = [c.unit_id for c in service.resolve(description, limit=3).candidates]
        top1 += found[:1] == [meant]
        top3 += meant in found
        empty += not found
    return top1 / len(queries), top3 / len(queries), empty


def main() -> None:
    with tempfile.TemporaryDirectory() as work:
        root = shutil.copytree(DATA / "units", Path(work) / "units")
        with Host(root, Path(work) / "data", namespace="bench_resolve") as host:
            service = UnitService(host)
            print(f"{len(host.unit_kinds())} units")
            for name in ("heldout.json", "queries.json"):
                queries = [tuple(q) for q in json.loads((DATA / name).read_text())["queries"]]
                top1, top3, empty = score(service, queries)  # type: ignore[arg-type]
                print(f"{name}: {len(queries)} queries, top-1 {top1:.1%}, top-3 {top3:.1%}, empty answers {empty}")


if __name__ == "__main__":
    main()
