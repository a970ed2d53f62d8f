"""unit_resolve: its quality on paraphrased descriptions, meaning offline, names found even misspelt, and a lexical
index that ranks exactly as scoring every unit did."""

from __future__ import annotations

import json
import re
import shutil
import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unit_mcp import Host, UnitService, resolve
from unit_mcp.models import Candidate, Evidence
from unit_mcp.resolve import (
    FALLBACK_CEILING,
    FIELD_WEIGHTS,
    LEXICAL_ONLY,
    LexicalIndex,
    ResolveIndex,
    UnitFacts,
    python_facts,
    source_facts,
    tokens,
)

DATA = Path(__file__).resolve().parent / "data" / "resolve"
TOP1_FLOOR = 0.98
HELDOUT_FLOOR = 0.75
"""heldout.json's top-1 floor (79.5% measured; the goal of issue 38 was 88%). The second held-out set
(heldout2/) has no floor here on purpose: it is measured, never tuned on (scripts/bench.py --only resolve)."""


def reference_rank(description: str, units: list[UnitFacts], limit: int) -> list[Candidate]:
    """The ranking as it was before the index: every unit scored in full. Kept verbatim as the oracle."""

    def term_score(term: str, value_tokens: set[str]) -> float:
        if term in value_tokens:
            return 1.0
        best = 0.0
        for token in value_tokens:
            if len(term) >= 3 and len(token) >= 3 and (token.startswith(term) or term.startswith(token)):
                best = max(best, 0.7)
            elif len(term) >= 4 and term in token:
                best = max(best, 0.5)
        return best

    terms = list(dict.fromkeys(tokens(description)))
    whole = description.strip().lower()
    candidates: list[Candidate] = []
    for unit in units:
        if not terms:
            break
        best = dict.fromkeys(terms, 0.0)
        evidence: list[Evidence] = []
        for field, value in unit.fields:
            value_tokens = set(tokens(value))
            matched = []
            for term in terms:
                score = term_score(term, value_tokens) * FIELD_WEIGHTS[field]
                if score > 0:
                    matched.append(term)
                    best[term] = max(best[term], score)
            if matched:
                shown = value if len(value) <= 200 else value[:200] + "…"
                evidence.append(Evidence(field=field, value=shown, matched=matched))
        confidence = sum(best.values()) / len(terms)
        if whole == unit.unit_id.lower():
            confidence = 1.0
        if confidence > 0:
            doc = next((value for field, value in unit.fields if field == "docstring"), "").strip().split("\n")[0]
            candidates.append(
                Candidate(
                    unit_id=unit.unit_id,
                    confidence=round(min(confidence, 1.0), 3),
                    evidence=evidence,
                    summary=(doc if len(doc) <= 200 else doc[:200] + "…") or None,
                )
            )
    candidates.sort(key=lambda c: (-c.confidence, c.unit_id))
    return candidates[:limit]


def matched(service: UnitService, description: str) -> list[str]:
    """The units whose words or names matched (every candidate also says which ranker answered)."""
    return [c.unit_id for c in service.resolve(description).candidates if words_matched(c)]


def words_matched(candidate: Candidate) -> list[Evidence]:
    return [e for e in candidate.evidence if e.field != "ranker"]


def test_paraphrased_descriptions_find_the_unit_meant(tmp_path: Path) -> None:
    queries = json.loads((DATA / "queries.json").read_text())["queries"]
    root = shutil.copytree(DATA / "units", tmp_path / "units")
    assert len(list(root.glob("*.py"))) >= 25 and len(queries) >= 40
    with Host(root, tmp_path / "data", namespace="resolve_quality") as host:
        service = UnitService(host)
        misses = []
        for description, meant in queries:
            candidates = service.resolve(description).candidates
            if not candidates or candidates[0].unit_id != meant:
                misses.append((description, meant, [c.unit_id for c in candidates[:3]]))
    top1 = 1 - len(misses) / len(queries)
    assert top1 >= TOP1_FLOOR, f"top-1 {top1:.1%} is below {TOP1_FLOOR:.0%}; misses: {misses}"


words = st.sampled_from(
    ["click", "counter", "counts", "weather", "forecast", "total", "totals", "money", "alarm", "alarms", "light",
     "set", "setter", "widget", "42", "4", "ab", "abc", "abcd", "xabcdx", "the", "unit", "Counter", "WeatherStation"]
)  # fmt: skip
field_values = st.lists(words, min_size=1, max_size=4).map(" ".join)
unit_ids = st.one_of(
    st.sampled_from(["counter", "weather", "alarms", "ledger", "abc", "widget_42", "Counter", "xabcdx"]),
    st.integers(0, 30).map(lambda n: f"u{n}"),
)
facts = st.builds(
    lambda unit_id, fields: UnitFacts(unit_id, (("unit_id", unit_id), ("module", f"units.{unit_id}"), *fields)),
    unit_ids,
    st.lists(st.tuples(st.sampled_from(["symbol", "file", "docstring"]), field_values), max_size=5),
)
descriptions = st.one_of(st.lists(words, min_size=0, max_size=5).map(" ".join), unit_ids, st.text(max_size=12))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(facts, unit_ids), max_size=30),
    st.lists(descriptions, min_size=1, max_size=4),
    st.integers(1, 4),
)
def test_the_index_ranks_exactly_as_scoring_every_unit(
    changes: list[UnitFacts | str], queries: list[str], limit: int
) -> None:
    """Units added, replaced and removed (a bare id) in any order; each query answers as the full scan does."""
    index = LexicalIndex()
    current: dict[str, UnitFacts] = {}
    for change in changes:
        if isinstance(change, str):
            index.update(change, None)
            current.pop(change, None)
        else:
            index.update(change.unit_id, change)
            current[change.unit_id] = change
    for description in queries:
        expected = reference_rank(description, list(current.values()), limit)
        found = index.query(description, limit)
        if expected or not current:
            assert found == expected
        else:  # no word matched: every unit is ranked by the fallback, without evidence, never nothing
            assert len(found) == min(limit, len(current)) and {c.unit_id for c in found} <= set(current)
            assert all(not c.evidence and c.confidence <= FALLBACK_CEILING for c in found)


def test_the_index_follows_reloads_and_unloads(tmp_path: Path) -> None:
    root = tmp_path / "units"
    root.mkdir()
    (root / "bell.py").write_text('"""Rings the bell."""\n')
    with Host(root, tmp_path / "data", namespace="resolve_follows") as host:
        service = UnitService(host)
        assert [c.unit_id for c in service.resolve("rings bell").candidates] == ["bell"]
        assert matched(service, "chimes") == []

        (root / "bell.py").write_text('"""Chimes on the hour."""\n\ndef strike():\n    pass\n')
        host.reload("bell")
        assert [c.unit_id for c in service.resolve("chimes strike").candidates] == ["bell"]
        assert matched(service, "rings") == []

        (root / "gong").mkdir()
        (root / "gong" / "__init__.py").write_text('"""Chimes loudly."""\n')
        host.reload("gong")
        assert {c.unit_id for c in service.resolve("chimes").candidates} == {"bell", "gong"}

        (root / "bell.py").unlink()
        host.unload("bell")
        assert [c.unit_id for c in service.resolve("chimes").candidates] == ["gong"]


def test_an_edit_through_the_service_is_resolved_at_once(service: UnitService) -> None:
    assert matched(service, "barometric pressure") == []
    source = service.read_source("weather", "__init__.py")
    service.apply_patch(
        "weather",
        "__init__.py",
        old='"""Weather forecasts',
        new='"""Barometric pressure and weather forecasts',
        expected_hash=source.hash,
    )
    assert service.resolve("barometric pressure").candidates[0].unit_id == "weather"


def unit(unit_id: str, docstring: str) -> UnitFacts:
    return UnitFacts(unit_id, (("unit_id", unit_id), ("module", f"units.{unit_id}"), ("docstring", docstring)))


def test_the_index_stops_early_but_never_drops_a_better_or_tied_unit() -> None:
    """The rare term is read first; the common one may still lift its units above (or level with) what it found."""
    units = [unit("b_z", "zeta"), unit("a_c", "counter")] + [unit(f"counter_{n}", "plain") for n in range(10)]
    index = LexicalIndex()
    for facts in units:
        index.update(facts.unit_id, facts)
    for description, limit in [("zeta counter", 1), ("zeta counter", 2), ("zeta plain", 3), ("counter", 4)]:
        assert index.query(description, limit) == reference_rank(description, units, limit)
    # A tie at the cut is broken by unit id, as before: a_c (read second) beats b_z (read first).
    tie = [unit("b_z", "zeta"), unit("a_c", "counter")]
    index = LexicalIndex()
    for facts in tie:
        index.update(facts.unit_id, facts)
    assert [c.unit_id for c in index.query("zeta counter", 1)] == ["a_c"]


@pytest.mark.parametrize(
    ("units", "queries", "floor"),
    [("units", "heldout.json", HELDOUT_FLOOR), ("heldout2/units", "heldout2/queries.json", None)],
)
def test_held_out_paraphrases_share_no_word_with_the_units_and_always_get_candidates(
    tmp_path: Path, units: str, queries: str, floor: float | None
) -> None:
    """Each held-out set (scripts/bench.py --only resolve reports top-1 and top-3) is what it claims: at least 40
    queries over at least 25 units, none sharing a word with any unit's facts; each answer still lists units.
    The first is held to a floor; the second, written before the meaning ranker was tuned, only measured."""
    pairs = json.loads((DATA / queries).read_text())["queries"]
    root = shutil.copytree(DATA / units, tmp_path / "units")
    with Host(root, tmp_path / "data", namespace="resolve_heldout") as host:
        service = UnitService(host)
        facts = [service.unit_facts(unit_id, kind) for unit_id, kind in host.unit_kinds().items()]
        words = {word for unit in facts for _, value in unit.fields for word in tokens(value)}
        assert len(pairs) >= 40 and len({meant for _, meant in pairs}) >= 25
        assert {meant for _, meant in pairs} <= set(host.unit_kinds())
        top1 = 0
        for description, meant in pairs:
            assert not set(tokens(description)) & words, description
            candidates = service.resolve(description, limit=3).candidates
            assert candidates and all(c.summary for c in candidates), description
            top1 += candidates[0].unit_id == meant
    if floor is not None:
        assert top1 / len(pairs) >= floor


def data_index(root: Path, **options: bool) -> ResolveIndex:
    """An index of a data set's units, with the facts the service gives them."""
    index = ResolveIndex(**options)
    for path in sorted(root.glob("*.py")):
        docstring, names = python_facts(path.read_text())
        fields = [("unit_id", path.stem), ("module", f"units.{path.stem}"), ("file", path.name)]
        fields += [("docstring", docstring)] if docstring else []
        fields += [("symbol", name) for name in names]
        index.update(path.stem, UnitFacts(path.stem, tuple(fields)))
    return index


def test_meaning_is_ranked_offline_with_the_weights_of_the_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    """No network, ever: the model is loaded afresh with every socket refused, and answers by meaning."""

    def refused(*args: object, **kwargs: object) -> None:
        raise OSError("network access in a test that refuses it")

    monkeypatch.setattr(resolve, "_embedders", {})
    for name in ("socket", "create_connection", "getaddrinfo"):
        monkeypatch.setattr(socket, name, refused)
    index = data_index(DATA / "units")
    assert index.ranker == "meaning"
    found = index.query("what is the temperature outside", 3)
    assert "thermostat" in [c.unit_id for c in found]
    assert found[0].evidence[0].field == "ranker" and found[0].evidence[0].value.startswith("meaning: cosine")
    assert resolve._embedders, "the model was loaded in this test"


def test_without_the_meaning_extra_the_lexical_ranker_answers_and_says_so() -> None:
    index = data_index(DATA / "units", meaning=False)
    assert index.ranker == "lexical"
    found = index.query("debits and credits", 2)
    assert found[0].unit_id == "ledger"
    assert all(c.evidence[0].field == "ranker" and c.evidence[0].value == LEXICAL_ONLY for c in found)
    assert index.query("qqqq zzzz", 2), "never empty while units exist"


def test_a_changed_unit_gets_a_new_vector_and_ranks_by_its_new_meaning() -> None:
    index = ResolveIndex()
    index.update("p1", unit("p1", "Rings a church bell on the hour."))
    index.update("p2", unit("p2", "Strikes the hours on the tower clock."))
    assert index.query("a bell that rings in church", 1)[0].unit_id == "p1"
    before = index.vector("p1")
    index.update("p1", unit("p1", "Sends newsletters to subscribers by email."))
    after = index.vector("p1")
    assert before is not None and after is not None and float(before @ after) < 0.99
    assert index.query("a bell that rings in church", 1)[0].unit_id == "p2"
    index.update("p1", None)
    assert index.vector("p1") is None and [c.unit_id for c in index.query("email", 5)] == ["p2"]


def test_ties_and_empty_documents_are_ranked_by_unit_id_and_never_dropped() -> None:
    index = ResolveIndex()
    for unit_id in ("zz", "aa", "mm"):
        index.update(unit_id, UnitFacts(unit_id, ()))  # nothing to embed: a zero vector, cosine 0
    assert [c.unit_id for c in index.query("anything at all", 3)] == ["aa", "mm", "zz"]
    assert [c.unit_id for c in index.query("anything at all", 2)] == ["aa", "mm"]
    index.update("twin_b", unit("twin_b", "Same words."))
    index.update("twin_a", UnitFacts("twin_a", index_fields("twin_b", "Same words.")))
    found = index.query("same words", 5)
    assert len(found) == 5 and all(0.0 <= c.confidence <= 1.0 for c in found)
    assert not index.query("x", 0)


def index_fields(unit_id: str, docstring: str) -> tuple[tuple[str, str], ...]:
    return (("module", f"units.{unit_id}"), ("docstring", docstring))


@pytest.mark.parametrize(
    "description",
    ["weather " * 1250, "\x00\x01\x02\x1b[31m\r\n\t\x7f" * 100, "\u200b\ufeff", "🌦️ " * 3000, "_" * 10_000],
)
def test_long_and_strange_descriptions_are_bounded_and_still_answered(description: str) -> None:
    index = data_index(DATA / "units")
    found = index.query(description, 3)
    assert len(found) == 3
    assert sum(len(e.value) for c in found for e in c.evidence) < 20_000


def test_a_description_that_names_a_unit_finds_it_first_even_misspelt() -> None:
    index = data_index(DATA / "units")
    for description, meant in [
        ("tmer", "timer"),
        ("the thremostat", "thermostat"),
        ("markdwon_render", "markdown_render"),
        ("raise_alrm", "alarms"),
        ("leaderbaord", "leaderboard"),
        ("ratelimit", "ratelimit"),
        ("units_convert", "units_convert"),
    ]:
        found = index.query(description, 1)[0]
        assert found.unit_id == meant, description
        assert any(e.field in ("unit_id", "symbol") for e in found.evidence), found.evidence
    # A known word is never read as a misspelt name: "look" does not name `lock`.
    index.update("door", UnitFacts("door", (("unit_id", "door"), ("symbol", "lock"))))
    assert not [e for e in index.query("look up a word", 40)[0].evidence if e.field == "symbol"]


def test_source_facts_read_routes_and_the_docstrings_of_functions() -> None:
    source = (
        '"""Weather station."""\n'
        "from starlette.routing import Route\n"
        "@app.get('/forecast/{city}')\n"
        "def forecast(city):\n"
        '    """Tomorrow\'s rain and wind for a city.\n\n    More."""\n'
        "def _private():\n    pass\n"
        "routes = [Route('/barometer', forecast)]\n"
    )
    facts = source_facts(source)
    assert ("docstring", "Weather station.") in facts and ("symbol", "forecast") in facts
    assert ("function_doc", "Tomorrow's rain and wind for a city.") in facts
    assert ("route", "/forecast/{city}") in facts and ("route", "/barometer") in facts
    assert not [f for f in facts if f[1] == "_private"]
    assert source_facts("def (") == []
    assert python_facts(source) == ("Weather station.", ["forecast"])


def test_test_names_and_routes_are_found() -> None:
    index = ResolveIndex()
    index.update("shop", UnitFacts("shop", (("unit_id", "shop"), ("test", "checkout"), ("route", "/cart/items"))))
    index.update("bank", unit("bank", "Accounts and transfers."))
    assert index.query("checkout", 1)[0].unit_id == "shop"
    assert index.query("cart items", 1)[0].unit_id == "shop"


_WORD = st.text(alphabet="abcde", min_size=1, max_size=7)


@settings(max_examples=300, deadline=None)
@given(word=_WORD, names=st.lists(_WORD, min_size=1, max_size=12, unique=True), gone=st.integers(0, 11))
def test_a_misspelt_word_finds_exactly_the_identifiers_one_edit_away(word: str, names: list[str], gone: int) -> None:
    """The symmetric-deletion lookup finds what comparing the word with every identifier would, and nothing more,
    also after a unit is forgotten."""
    index = resolve.NameIndex()
    for n, name in enumerate(names):
        index.update(f"u{n}", UnitFacts(f"u{n}", (("symbol", name),)))
    index.update(f"u{gone}", None)
    kept = {f"u{n}": name for n, name in enumerate(names) if n != gone}
    found = set(index.named(word, lambda _: False))
    fuzzy = len(word) >= 4  # a word of four letters or more, not a known word, may be misspelt
    expected = {
        unit_id
        for unit_id, name in kept.items()
        if name == word or (fuzzy and len(name) >= 4 and resolve._one_edit(word, name))
    }
    assert found == expected


def test_the_resolve_benchmark_runs_on_the_services_facts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """scripts/bench_resolve.py (and `scripts/bench.py --only resolve`) reads facts through the service: it broke
    unnoticed when the service was split. A small run of each part, with the goal on the oldest set."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "scripts"))
    from bench_resolve import at_scale, quality

    scores = quality(tmp_path)
    assert set(scores) == {"queries", "heldout", "heldout2"}
    assert scores["queries"]["shipped"]["top1"] >= 0.98 and scores["heldout"]["shipped"]["empty"] == 0
    scale = at_scale(300, queries=20)
    assert scale["units"] == 300 and scale["query_cpu_median_ms"] > 0 and scale["cores"]


_NAME = st.lists(st.text(alphabet="ab", min_size=1, max_size=5), min_size=1, max_size=3).map("_".join)
"""Identifiers of few letters, so that first words often share a deletion key (a key held by two words)."""
_CHANGE = st.tuples(st.integers(0, 5), st.none() | st.lists(_NAME, min_size=1, max_size=4))


@settings(max_examples=200, deadline=None)
@given(changes=st.lists(_CHANGE, min_size=1, max_size=20), words=st.lists(_WORD, min_size=1, max_size=3))
def test_the_name_index_after_any_changes_answers_as_one_built_afresh(
    changes: list[tuple[int, list[str] | None]], words: list[str]
) -> None:
    """Units whose identifiers share first words (kept as tuples, and the typo keys as one word or a tuple, to
    save memory) changed and removed in any order: the index answers as one built from what is left, and once
    every unit is gone it holds nothing (no key of a forgotten identifier is left behind)."""
    index = resolve.NameIndex()
    current: dict[str, UnitFacts] = {}
    for n, names in changes:
        unit_id = f"u{n}"
        facts = None if names is None else UnitFacts(unit_id, tuple(("symbol", name) for name in names))
        index.update(unit_id, facts)
        if facts is None:
            current.pop(unit_id, None)
        else:
            current[unit_id] = facts
    fresh = resolve.NameIndex()
    for unit_id, facts in current.items():
        fresh.update(unit_id, facts)
    description = " ".join(words)
    assert index.named(description, lambda _: False) == fresh.named(description, lambda _: False)
    for unit_id in list(current):
        index.update(unit_id, None)
    assert not index._units and not index._keys and not index._near and not index._by_unit


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=60), description=st.text(max_size=30))
def test_the_fallback_shares_letter_trigrams_as_strings_would(text: str, description: str) -> None:
    """A unit keeps its letter trigrams as two-byte numbers (not a set of strings): the share of a description's
    trigrams it holds is what comparing the strings gives."""

    def grams(value: str) -> set[str]:
        letters = " ".join(re.split(r"[^A-Za-z0-9]+", re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", value).lower()))
        return {letters[i : i + 3] for i in range(len(letters) - 2)}

    unit = UnitFacts("u", (("unit_id", "u"), ("docstring", text)))
    expected = len(grams(description) & grams("u " + text)) / len(grams(description)) if grams(description) else 0
    entry = resolve._Entry(unit, resolve._field_tokens(unit))
    assert entry.likeness(resolve._trigrams(description)) == expected


def test_the_index_keeps_a_few_kilobytes_a_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory per unit, traced (no timing): the lexical index kept about 20 KiB a unit while a unit's letter
    trigrams were a set of strings, the identifier index about 11 KiB a unit of five made-up identifiers while
    every typo key held a set; now about 2.5 and 5."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "scripts"))
    from bench_resolve import indexed, synthetic_facts, traced_kib, varied_names

    count = 2000
    facts, varied = synthetic_facts(count), varied_names(count)
    assert traced_kib(lambda: indexed(LexicalIndex(), facts)) < 6 * count
    assert traced_kib(lambda: indexed(resolve.NameIndex(), varied)) < 8 * count
