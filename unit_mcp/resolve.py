"""Rank units against a natural-language description, with the evidence of what matched."""

from __future__ import annotations

import ast
import re
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


def _term_score(term: str, value_tokens: set[str]) -> float:
    if term in value_tokens:
        return 1.0
    best = 0.0
    for token in value_tokens:
        if len(term) >= 3 and len(token) >= 3 and (token.startswith(term) or term.startswith(token)):
            best = max(best, 0.7)
        elif len(term) >= 4 and term in token:
            best = max(best, 0.5)
    return best


def rank(description: str, units: list[UnitFacts], limit: int) -> list[Candidate]:
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
            weight = FIELD_WEIGHTS[field]
            for term in terms:
                score = _term_score(term, value_tokens) * weight
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
            candidates.append(
                Candidate(unit_id=unit.unit_id, confidence=round(min(confidence, 1.0), 3), evidence=evidence)
            )
    candidates.sort(key=lambda c: (-c.confidence, c.unit_id))
    return candidates[:limit]
