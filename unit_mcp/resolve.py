"""Rank units against a natural-language description, with the evidence of what matched."""

from __future__ import annotations

import ast
import heapq
import re
import threading
from dataclasses import dataclass

from .models import Candidate, Evidence

STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "can",
        "do",
        "does",
        "find",
        "for",
        "from",
        "get",
        "give",
        "has",
        "have",
        "i",
        "in",
        "into",
        "is",
        "it",
        "its",
        "me",
        "my",
        "of",
        "on",
        "or",
        "that",
        "the",
        "this",
        "to",
        "unit",
        "units",
        "what",
        "where",
        "which",
        "who",
        "with",
        "would",
        "you",
        "plugin",
        "module",
    ]
)
FIELD_WEIGHTS = {"unit_id": 1.0, "module": 0.9, "symbol": 0.75, "file": 0.6, "docstring": 0.5}
FALLBACK_CEILING = 0.2
"""The highest confidence of a unit ranked by the fallback (no word of the description matched)."""
MAX_EVIDENCE = 12
"""Evidence a candidate shows at most (a unit of thousands of matching symbols would fill a result)."""
_SPLIT = re.compile(r"[^A-Za-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def tokens(text: str) -> list[str]:
    out: list[str] = []
    for word in _SPLIT.split(_CAMEL.sub(" ", text)):
        word = word.lower()
        if len(word) >= 2 and word not in STOPWORDS:
            out.append(word)
    return out


@dataclass(frozen=True)
class UnitFacts:
    """What a unit offers to match against: (field, value) pairs."""

    unit_id: str
    fields: tuple[tuple[str, str], ...]


def python_facts(source: str) -> tuple[str | None, list[str]]:
    """The module docstring and public top-level function and class names of a Python source."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None, []
    names = [
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_")
    ]
    return ast.get_docstring(tree), names


def _token_score(term: str, token: str) -> float:
    """How a query term matches one indexed token: exactly, as a prefix either way, or inside it."""
    if term == token:
        return 1.0
    if len(term) >= 3 and len(token) >= 3 and (token.startswith(term) or term.startswith(token)):
        return 0.7
    if len(term) >= 4 and term in token:
        return 0.5
    return 0.0


def _trigrams(text: str) -> set[str]:
    letters = " ".join(_SPLIT.split(_CAMEL.sub(" ", text).lower()))
    return {letters[i : i + 3] for i in range(len(letters) - 2)}


class _Entry:
    """One indexed unit: its facts with each value's tokens, and the best field weight of each of its tokens."""

    __slots__ = ("facts", "fields", "summary", "trigrams", "weights")

    def __init__(self, facts: UnitFacts) -> None:
        self.facts = facts
        self.fields = tuple((field, value, frozenset(tokens(value))) for field, value in facts.fields)
        docstring = next((value for field, value in facts.fields if field == "docstring"), "")
        first = docstring.strip().split("\n", 1)[0]
        self.summary = (first if len(first) <= 200 else first[:200] + "…") or None
        self.trigrams = _trigrams(" ".join(value for _, value in facts.fields))
        self.weights: dict[str, float] = {}
        for field, _, value_tokens in self.fields:
            for token in value_tokens:
                self.weights[token] = max(self.weights.get(token, 0.0), FIELD_WEIGHTS[field])

    def confidence(self, term_scores: list[dict[str, float]], whole: str) -> float:
        """Each term's best weighted match over the unit's tokens, averaged over the terms; 1 for the exact unit
        id. `term_scores` holds, per term, the score of every indexed token it matches (see `_matches`)."""
        if whole == self.facts.unit_id.lower():
            return 1.0
        total = 0.0
        for scores in term_scores:
            best = 0.0
            for token, weight in self.weights.items():
                score = scores.get(token)
                if score is not None and score * weight > best:
                    best = score * weight
            total += best
        return round(min(total / len(term_scores), 1.0), 3)

    def candidate(self, terms: list[str], term_scores: list[dict[str, float]], confidence: float) -> Candidate:
        evidence: list[Evidence] = []
        for field, value, value_tokens in self.fields:
            matched = [
                term
                for term, scores in zip(terms, term_scores, strict=True)
                if any(token in scores for token in value_tokens)
            ]
            if matched:
                shown = value if len(value) <= 200 else value[:200] + "…"
                evidence.append(Evidence(field=field, value=shown, matched=matched))
                if len(evidence) == MAX_EVIDENCE:
                    break
        return Candidate(unit_id=self.facts.unit_id, confidence=confidence, evidence=evidence, summary=self.summary)

    def likeness(self, grams: set[str]) -> float:
        """How much of a description's letter trigrams the unit's facts share: the fallback when no word matches."""
        return len(grams & self.trigrams) / len(grams) if grams else 0.0


class ResolveIndex:
    """Units' facts in an inverted index, kept current one unit at a time (`update` after each reload).

    A query looks up the tokens each term matches (exactly, as a prefix either way, or as a substring), takes
    its terms rarest first and scores only the units they reach, stopping as soon as the terms left could not
    lift an unseen unit into the top `limit` (max-score pruning). It ranks exactly as scoring every unit would,
    at a cost that follows the matching units rather than all of them.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._units: dict[str, _Entry] = {}
        self._by_lower: dict[str, set[str]] = {}
        self._postings: dict[str, dict[str, float]] = {}  # token -> unit id -> the unit's best field weight
        self._field_counts: dict[str, dict[str, int]] = {}  # token -> field -> units with it in that field
        self._prefixes: dict[str, set[str]] = {}  # first three characters -> tokens
        self._grams: dict[str, set[str]] = {}  # every four characters -> tokens containing them

    def __len__(self) -> int:
        return len(self._units)

    def __contains__(self, unit_id: object) -> bool:
        return unit_id in self._units

    def update(self, unit_id: str, facts: UnitFacts | None) -> None:
        """Index a unit's current facts, or forget the unit (None)."""
        with self._lock:
            old = self._units.pop(unit_id, None)
            if old is not None:
                self._forget(old)
            if facts is not None:
                self._add(_Entry(facts))

    def _add(self, entry: _Entry) -> None:
        unit_id = entry.facts.unit_id
        self._units[unit_id] = entry
        self._by_lower.setdefault(unit_id.lower(), set()).add(unit_id)
        for token, weight in entry.weights.items():
            if token not in self._postings:
                self._postings[token] = {}
                self._field_counts[token] = {}
                if len(token) >= 3:
                    self._prefixes.setdefault(token[:3], set()).add(token)
                for gram in _grams(token):
                    self._grams.setdefault(gram, set()).add(token)
            self._postings[token][unit_id] = weight
        for token, field in _token_fields(entry):
            counts = self._field_counts[token]
            counts[field] = counts.get(field, 0) + 1

    def _forget(self, entry: _Entry) -> None:
        unit_id = entry.facts.unit_id
        lower = self._by_lower[unit_id.lower()]
        lower.discard(unit_id)
        if not lower:
            del self._by_lower[unit_id.lower()]
        for token, field in _token_fields(entry):
            counts = self._field_counts[token]
            counts[field] -= 1
            if not counts[field]:
                del counts[field]
        for token in entry.weights:
            postings = self._postings[token]
            del postings[unit_id]
            if postings:
                continue
            del self._postings[token], self._field_counts[token]
            if len(token) >= 3:
                _discard(self._prefixes, token[:3], token)
            for gram in _grams(token):
                _discard(self._grams, gram, token)

    def _matches(self, term: str) -> dict[str, float]:
        """The indexed tokens a query term matches, with the score of that match (before field weights)."""
        found: set[str] = set()
        if term in self._postings:
            found.add(term)
        if len(term) >= 3:
            found.update(t for t in self._prefixes.get(term[:3], ()) if t.startswith(term))
            found.update(term[:k] for k in range(3, len(term)) if term[:k] in self._postings)
        if len(term) >= 4:
            grams = [self._grams.get(gram, set()) for gram in _grams(term)]
            rarest = min(grams, key=len)
            found.update(t for t in rarest if term in t)
        return {token: _token_score(term, token) for token in found}

    def _max_weight(self, token: str) -> float:
        return max(FIELD_WEIGHTS[field] for field in self._field_counts[token])

    def query(self, description: str, limit: int) -> list[Candidate]:
        """The best `limit` units by their matching words; when no word matches any unit, every unit ranked by
        shared letter trigrams (a misspelling, another word form) with a confidence of at most FALLBACK_CEILING,
        so that the answer is never empty while units exist and the summaries let the caller choose."""
        found = self._query(description, limit)
        if found or not self._units:
            return found
        grams = _trigrams(description)
        with self._lock:
            ranked = heapq.nsmallest(
                limit, ((-entry.likeness(grams), unit_id) for unit_id, entry in self._units.items())
            )
            return [
                self._units[unit_id].candidate([], [], round(-score * FALLBACK_CEILING, 3)) for score, unit_id in ranked
            ]

    def _query(self, description: str, limit: int) -> list[Candidate]:
        terms = list(dict.fromkeys(tokens(description)))
        if not terms:
            return []
        whole = description.strip().lower()
        with self._lock:
            term_scores = [self._matches(term) for term in terms]
            plans = []
            for scores in term_scores:
                size = sum(len(self._postings[token]) for token in scores)
                top = max((score * self._max_weight(token) for token, score in scores.items()), default=0.0)
                plans.append((size, top, scores))
            plans.sort(key=lambda plan: plan[0])
            scored: dict[str, float] = {}
            for unit_id in self._by_lower.get(whole, ()):
                scored[unit_id] = 1.0
            for step, (_, _, scores) in enumerate(plans):
                if len(scored) >= limit:
                    # Any unit not scored yet matches none of the terms before this one.
                    bound = sum(plan[1] for plan in plans[step:]) / len(terms) + 1e-9
                    if round(min(bound, 1.0), 3) < heapq.nlargest(limit, scored.values())[-1]:
                        break
                for token in scores:
                    for unit_id in self._postings[token]:
                        if unit_id not in scored:
                            scored[unit_id] = self._units[unit_id].confidence(term_scores, whole)
            best = heapq.nsmallest(limit, scored.items(), key=lambda item: (-item[1], item[0]))
            return [self._units[unit_id].candidate(terms, term_scores, confidence) for unit_id, confidence in best]


def _grams(token: str) -> set[str]:
    return {token[i : i + 4] for i in range(len(token) - 3)}


def _discard(index: dict[str, set[str]], key: str, token: str) -> None:
    tokens_ = index[key]
    tokens_.discard(token)
    if not tokens_:
        del index[key]


def _token_fields(entry: _Entry) -> list[tuple[str, str]]:
    """Each (token, field) of the entry once: a field counts a token once however often its value repeats it."""
    return list(dict.fromkeys((token, field) for field, _, value_tokens in entry.fields for token in value_tokens))
