"""unit_resolve on paraphrased descriptions (issues 24 and 38): top-1 and top-3 of the lexical ranker, the
embedding alone and the shipped ranker, side by side, on the older paraphrase set, the held-out set and the
second held-out set (written before the meaning ranker was tuned, never tuned on); and the meaning ranker at
10,000 units: query latency (wall clock, and the CPU time of the querying thread, which a loaded machine's
waits do not inflate; the load average is reported beside them), one unit re-embedded, memory.
scripts/bench.py --only resolve reports the same.

    .venv/bin/python scripts/bench_resolve.py [--variants]
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from unit_mcp import Host, UnitService
from unit_mcp.resolve import (
    NAME_BOOST,
    LexicalIndex,
    MeaningIndex,
    NameIndex,
    ResolveIndex,
    UnitFacts,
    load_embedder,
    meaning_folder,
    tokens,
    unit_document,
)

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "resolve"
SETS = {  # name: (units folder, queries file)
    "queries": ("units", "queries.json"),
    "heldout": ("units", "heldout.json"),
    "heldout2": ("heldout2/units", "heldout2/queries.json"),
}
Ranker = Callable[[str, int], list[str]]


def score(service: UnitService, queries: list[tuple[str, str]]) -> tuple[float, float, int]:
    """(top-1, top-3, answers with no candidate) over `queries`, through the service."""
    return score_ranker(lambda text, n: [c.unit_id for c in service.resolve(text, limit=n).candidates], queries)


def score_ranker(rank: Ranker, queries: list[tuple[str, str]]) -> tuple[float, float, int]:
    top1 = top3 = empty = 0
    for description, meant in queries:
        found = rank(description, 3)
        top1 += found[:1] == [meant]
        top3 += meant in found
        empty += not found
    return top1 / len(queries), top3 / len(queries), empty


def rankers(facts: list[UnitFacts], service: UnitService) -> dict[str, Ranker]:
    """The three rankers over the same facts (the service's): lexical, the embedding alone, shipped."""
    lexical = ResolveIndex(meaning=False)
    for unit in facts:
        lexical.update(unit.unit_id, unit)
    out: dict[str, Ranker] = {"lexical": lambda text, n: [c.unit_id for c in lexical.query(text, n)]}
    folder = meaning_folder()
    if folder is not None:
        alone = MeaningIndex(folder)
        for unit in facts:
            alone.update(unit.unit_id, unit_document(unit))

        def embedding(text: str, n: int) -> list[str]:
            ids, cosines = alone.cosines(" ".join(tokens(text)) or text)
            return [ids[row] for row in sorted(range(len(ids)), key=lambda row: (-cosines[row], ids[row]))[:n]]

        out["embedding alone"] = embedding
    out["shipped"] = lambda text, n: [c.unit_id for c in service.resolve(text, limit=n).candidates]
    return out


def late_interaction(facts: list[UnitFacts], alpha: float, top: int = 20) -> Ranker | None:
    """A variant tried for issue 38 and not shipped: the shipped ranker's best `top` units re-ranked by
    `alpha` * pooled cosine + (1 - alpha) * MaxSim + the identifier boost, where MaxSim is the mean over the
    description's tokens, weighted by each token's vector length, of its best cosine with any token of the
    unit's document (ColBERT-style late interaction over wordllama's static token vectors)."""
    index = ResolveIndex()
    meaning, names = index._meaning, index._names
    if meaning is None or names is None:
        return None
    for unit in facts:
        index.update(unit.unit_id, unit)
    np, embedder = meaning.embedder._np, meaning.embedder

    def token_rows(text: str) -> tuple[Any, Any]:
        ids = list(dict.fromkeys(embedder._tokenizer.encode(text, add_special_tokens=False).ids))
        rows = embedder._table[ids].astype(np.float32)
        lengths = np.linalg.norm(rows, axis=1)
        return rows / np.maximum(lengths, 1e-9)[:, None], lengths

    documents = {unit.unit_id: token_rows(unit_document(unit))[0] for unit in facts}

    def rank(text: str, n: int) -> list[str]:
        words = " ".join(tokens(text)) or text
        ids, cosines = meaning.cosines(words)
        scores = cosines.copy()
        for unit_id, matches in names.named(text, embedder.is_word).items():
            scores[meaning.row(unit_id)] += NAME_BOOST * min(1.0, sum(m.share for m in matches))
        query, lengths = token_rows(words)
        for row in np.argsort(-scores)[:top] if len(query) else ():
            best = (query @ documents[ids[row]].T).max(axis=1)
            late = float((best * lengths).sum() / lengths.sum())
            scores[row] += (alpha - 1) * cosines[row] + (1 - alpha) * late
        return [ids[row] for row in sorted(range(len(ids)), key=lambda row: (-scores[row], ids[row]))[:n]]

    return rank


def quality(work: Path, variants: bool = False) -> dict[str, dict[str, dict[str, Any]]]:
    """{set: {ranker: {top1, top3, empty, queries}}}; with `variants`, also the late-interaction re-rankers."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, (units, queries_file) in SETS.items():
        queries = [(q, m) for q, m in json.loads((DATA / queries_file).read_text())["queries"]]
        root = shutil.copytree(DATA / units, work / f"quality-{name}")
        with Host(root, work / f"quality-data-{name}", namespace=f"bench_resolve_{name}") as host:
            service = UnitService(host)
            facts = [service.unit_facts(unit_id, kind) for unit_id, kind in host.unit_kinds().items()]
            out[name] = {}
            by_name = rankers(facts, service)
            for alpha in (0.5, 0.7, 0.9) if variants else ():
                late = late_interaction(facts, alpha)
                if late is not None:
                    by_name[f"MaxSim re-rank of the top 20, alpha {alpha}"] = late
            for ranker, rank in by_name.items():
                top1, top3, empty = score_ranker(rank, queries)
                out[name][ranker] = {"queries": len(queries), "top1": top1, "top3": top3, "empty": empty}
    return out


def synthetic_facts(count: int) -> list[UnitFacts]:
    """`count` units whose docstrings and names are drawn from both data sets' units (so no two are alike)."""
    sources = []
    for folder in (DATA / "units", DATA / "heldout2" / "units"):
        for path in sorted(folder.glob("*.py")):
            text = path.read_text()
            sources.append((path.stem, text.split('"""')[1]))
    rnd = random.Random(38)
    words = sorted({w for _, doc in sources for w in tokens(doc)})
    out = []
    for n in range(count):
        stem, doc = sources[n % len(sources)]
        unit_id = f"{stem}_{n:05d}"
        extra = " ".join(rnd.sample(words, 4))
        fields = (
            ("unit_id", unit_id),
            ("module", f"units.{unit_id}"),
            ("file", f"{unit_id}.py"),
            ("docstring", f"{doc} Also {extra}."),
            ("symbol", f"{rnd.choice(words)}_{rnd.choice(words)}"),
        )
        out.append(UnitFacts(unit_id, fields))
    return out


def varied_names(count: int) -> list[UnitFacts]:
    """`count` units of five identifiers each whose first words are made-up words, nearly all distinct: the case
    that fills the typo index (every distinct first word and its deletions), which `synthetic_facts`'s few
    hundred shared words do not show."""
    rnd = random.Random(38)

    def word() -> str:
        return "".join(rnd.choice("bcdfghklmnprstvz") + rnd.choice("aeiou") for _ in range(rnd.randint(2, 4)))

    out = []
    for n in range(count):
        unit_id = f"{word()}_{word()}_{n}"
        names = [("symbol", f"{word()}_{word()}") for _ in range(3)] + [("test", f"{word()}_{word()}")]
        fields = (("unit_id", unit_id), ("module", f"units.{unit_id}"), ("docstring", "Some text."), *names)
        out.append(UnitFacts(unit_id, fields))
    return out


def traced_kib(build: Callable[[], object]) -> int:
    """KiB that `build()` allocates and keeps (what it returns), traced."""
    tracemalloc.start()
    kept = build()
    kib = tracemalloc.get_traced_memory()[0] // 1024
    tracemalloc.stop()
    del kept
    return kib


def indexed(index: Any, facts: list[UnitFacts]) -> Any:
    for unit in facts:
        index.update(unit.unit_id, unit)
    return index


def flushed(index: ResolveIndex) -> ResolveIndex:
    index.flush()
    return index


def percentile(samples: list[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def at_scale(count: int, queries: int = 400) -> dict[str, Any]:
    """The shipped ranker over `count` synthetic units, built as the service builds it (update per unit)."""
    facts = synthetic_facts(count)
    descriptions = [q for _, (_, f) in SETS.items() for q, _ in json.loads((DATA / f).read_text())["queries"]]
    lexical_kib = traced_kib(lambda: indexed(LexicalIndex(), facts))
    names_kib = traced_kib(lambda: indexed(NameIndex(), facts))
    varied = varied_names(count)
    names_varied_kib = traced_kib(lambda: indexed(NameIndex(), varied))
    folder = meaning_folder()
    if folder is not None:
        load_embedder(folder)  # the model's table (16 MB, loaded once per process) is not the index's
    shipped_kib = traced_kib(lambda: flushed(indexed(ResolveIndex(), facts)))
    index = ResolveIndex()
    started = time.perf_counter()
    for unit in facts:
        index.update(unit.unit_id, unit)
    update_all_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    first = index.query(descriptions[0], 5)
    first_ms = (time.perf_counter() - started) * 1000
    assert first
    samples, cpu = [], []
    load_before = os.getloadavg()[0]
    for n in range(queries):
        started, started_cpu = time.perf_counter(), time.thread_time()
        index.query(descriptions[n % len(descriptions)], 5)
        cpu.append((time.thread_time() - started_cpu) * 1000)
        samples.append((time.perf_counter() - started) * 1000)
    reembed = []
    for n in range(200):
        unit = facts[n * 37 % count]
        changed = UnitFacts(unit.unit_id, (*unit.fields, ("docstring", f"Changed {n} times.")))
        started = time.perf_counter()
        index.update(unit.unit_id, changed)
        index.flush()
        reembed.append((time.perf_counter() - started) * 1000)
    return {
        "units": count,
        "update_every_unit_ms": round(update_all_ms, 1),
        "first_query_ms": round(first_ms, 1),
        "query_median_ms": round(statistics.median(samples), 3),
        "query_p99_ms": round(percentile(samples, 0.99), 3),
        "query_cpu_median_ms": round(statistics.median(cpu), 3),
        "query_cpu_p99_ms": round(percentile(cpu, 0.99), 3),
        "load_average": round(max(load_before, os.getloadavg()[0]), 1),
        "cores": os.cpu_count(),
        "reembed_median_ms": round(statistics.median(reembed), 3),
        "reembed_p99_ms": round(percentile(reembed, 0.99), 3),
        "lexical_index_kib": lexical_kib,
        "names_index_kib": names_kib,
        "names_index_varied_kib": names_varied_kib,
        "shipped_index_kib": shipped_kib,
    }


def main() -> None:
    """`--variants`: the quality of the variants tried and not shipped, and no run at scale."""
    variants = "--variants" in sys.argv[1:]
    with tempfile.TemporaryDirectory() as work:
        for name, by_ranker in quality(Path(work), variants).items():
            for ranker, f in by_ranker.items():
                top = f"top-1 {f['top1']:.1%}, top-3 {f['top3']:.1%}"
                print(f"{name} ({f['queries']}) {ranker}: {top}, empty {f['empty']}")
    if not variants:
        print(at_scale(10_000))


if __name__ == "__main__":
    main()
