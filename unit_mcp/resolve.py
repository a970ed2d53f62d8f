"""Rank units against a natural-language description, with the evidence of what matched.

Two signals: what a unit means (a static word embedding, `MeaningIndex`, when the `meaning` extra is installed)
ranks; the words it contains (`LexicalIndex`) and the identifiers a description names, even misspelt
(`NameIndex`), lift a unit above its meaning. `ResolveIndex` combines them and says which answered.
"""

from __future__ import annotations

import ast
import heapq
import importlib.util
import re
import sys
import threading
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
FIELD_WEIGHTS = {
    "unit_id": 1.0,
    "module": 0.9,
    "symbol": 0.75,
    "route": 0.75,
    "test": 0.6,
    "file": 0.6,
    "docstring": 0.5,
    "function_doc": 0.4,
}
FALLBACK_CEILING = 0.2
"""The highest confidence of a unit ranked by the fallback (no word of the description matched)."""
MAX_TERMS = 64
"""Words of a description matched at most."""
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


ROUTE_CALLS = frozenset(["get", "post", "put", "patch", "delete", "head", "options", "route", "websocket", "Route",
                         "WebSocketRoute", "Mount", "api_route", "add_route", "add_api_route"])  # fmt: skip
"""Calls whose first argument, a string starting with '/', is a route path (Starlette, FastAPI, Flask, ...)."""


def source_facts(source: str) -> list[tuple[str, str]]:
    """What a Python source offers to find it by: its docstring, public top-level names, the route paths it
    declares (a decorator or call such as `@app.get("/weather")` or `Route("/weather", ...)`) and the first line
    of each public function's and class's docstring."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    facts: list[tuple[str, str]] = []
    docstring = ast.get_docstring(tree)
    if docstring:
        facts.append(("docstring", docstring.strip()))
    for statement in tree.body:
        if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if not statement.name.startswith("_"):
            facts.append(("symbol", statement.name))
            doc = ast.get_docstring(statement)
            if doc and doc.strip():
                facts.append(("function_doc", doc.strip().split("\n", 1)[0]))
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and call.args:
            func = call.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            first = call.args[0]
            if (
                name in ROUTE_CALLS
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and first.value.startswith("/")
            ):
                facts.append(("route", first.value[:200]))
    return list(dict.fromkeys(facts))


def _token_score(term: str, token: str) -> float:
    """How a query term matches one indexed token: exactly, as a prefix either way, or inside it."""
    if term == token:
        return 1.0
    if len(term) >= 3 and len(token) >= 3 and (token.startswith(term) or term.startswith(token)):
        return 0.7
    if len(term) >= 4 and term in token:
        return 0.5
    return 0.0


_GRAM_CODES = bytes(max(" 0123456789abcdefghijklmnopqrstuvwxyz".find(chr(byte)), 0) for byte in range(256))
"""Each character a trigram may hold (a space, a digit, a lower-case ASCII letter) as a number below 37; words
hold nothing else once split, anything else would count as a space."""


def _trigrams(text: str) -> set[int]:
    """The text's letter trigrams (its words lower-cased, joined by one space), each as a number below 37 ** 3:
    a unit keeps them as an array of two-byte numbers, not a set of strings (about 15 KB a unit)."""
    letters = " ".join(_SPLIT.split(_CAMEL.sub(" ", text).lower()))
    codes = letters.encode("ascii", "replace").translate(_GRAM_CODES)
    return {(a * 37 + b) * 37 + c for a, b, c in zip(codes, codes[1:], codes[2:], strict=False)}


def _field_tokens(facts: UnitFacts) -> list[tuple[str, str, frozenset[str]]]:
    """Each (field, value) of the facts with the value's tokens: worked out when needed (evidence of the few
    units shown, an update), not kept for every unit."""
    return [(field, value, frozenset(map(sys.intern, tokens(value)))) for field, value in facts.fields]


_FIELD_BITS = {field: 1 << n for n, field in enumerate(FIELD_WEIGHTS)}
_MASK_WEIGHT = tuple(
    max((weight for n, weight in enumerate(FIELD_WEIGHTS.values()) if mask >> n & 1), default=0.0)
    for mask in range(1 << len(FIELD_WEIGHTS))
)
"""The best weight of the fields a mask of `_FIELD_BITS` names."""


class _Entry:
    """One indexed unit: its facts, its summary, its letter trigrams and, per token, the fields holding it as
    a bit mask (a small int, shared by every unit; its best weight is `_MASK_WEIGHT[mask]`). The tokens are
    interned: one copy however many units hold them."""

    __slots__ = ("facts", "masks", "summary", "trigrams")

    def __init__(self, facts: UnitFacts, fields: list[tuple[str, str, frozenset[str]]]) -> None:
        self.facts = facts
        docstring = next((value for field, value in facts.fields if field == "docstring"), "")
        first = docstring.strip().split("\n", 1)[0]
        self.summary = (first if len(first) <= 200 else first[:200] + "…") or None
        self.trigrams = array("H", sorted(_trigrams(" ".join(value for _, value in facts.fields))))
        self.masks: dict[str, int] = {}
        for field, _, value_tokens in fields:
            bit = _FIELD_BITS[field]
            for token in value_tokens:
                self.masks[token] = self.masks.get(token, 0) | bit

    def confidence(self, term_scores: list[dict[str, float]], whole: str) -> float:
        """Each term's best weighted match over the unit's tokens, averaged over the terms; 1 for the exact unit
        id. `term_scores` holds, per term, the score of every indexed token it matches (see `_matches`)."""
        if whole == self.facts.unit_id.lower():
            return 1.0
        total = 0.0
        for scores in term_scores:
            best = 0.0
            for token, mask in self.masks.items():
                score = scores.get(token)
                if score is not None and score * _MASK_WEIGHT[mask] > best:
                    best = score * _MASK_WEIGHT[mask]
            total += best
        return round(min(total / len(term_scores), 1.0), 3)

    def candidate(self, terms: list[str], term_scores: list[dict[str, float]], confidence: float) -> Candidate:
        evidence: list[Evidence] = []
        hits = {token for scores in term_scores for token in scores if token in self.masks}
        for field, value in self.facts.fields if hits else ():
            lowered = value.lower()
            if not any(token in lowered for token in hits):
                continue  # a token of the value is part of the lower-cased value: no need to split this one
            value_tokens = frozenset(tokens(value))
            matched = [
                term
                for term, scores in zip(terms, term_scores, strict=True)
                if not scores.keys().isdisjoint(value_tokens)
            ]
            if matched:
                shown = value if len(value) <= 200 else value[:200] + "…"
                evidence.append(Evidence(field=field, value=shown, matched=matched))
                if len(evidence) == MAX_EVIDENCE:
                    break
        return Candidate(unit_id=self.facts.unit_id, confidence=confidence, evidence=evidence, summary=self.summary)

    def likeness(self, grams: set[int]) -> float:
        """How much of a description's letter trigrams the unit's facts share: the fallback when no word matches."""
        return len(grams.intersection(self.trigrams)) / len(grams) if grams else 0.0


class LexicalIndex:
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
                self._add(_Entry(facts, _field_tokens(facts)))

    def _add(self, entry: _Entry) -> None:
        unit_id = entry.facts.unit_id
        self._units[unit_id] = entry
        self._by_lower.setdefault(unit_id.lower(), set()).add(unit_id)
        for token, mask in entry.masks.items():
            if token not in self._postings:
                self._postings[token] = {}
                self._field_counts[token] = {}
                if len(token) >= 3:
                    self._prefixes.setdefault(token[:3], set()).add(token)
                for gram in _grams(token):
                    self._grams.setdefault(gram, set()).add(token)
            self._postings[token][unit_id] = _MASK_WEIGHT[mask]
            counts = self._field_counts[token]
            for field, bit in _FIELD_BITS.items():
                if mask & bit:
                    counts[field] = counts.get(field, 0) + 1

    def _forget(self, entry: _Entry) -> None:
        unit_id = entry.facts.unit_id
        lower = self._by_lower[unit_id.lower()]
        lower.discard(unit_id)
        if not lower:
            del self._by_lower[unit_id.lower()]
        for token, mask in entry.masks.items():
            counts = self._field_counts[token]
            for field, bit in _FIELD_BITS.items():
                if mask & bit:
                    counts[field] -= 1
                    if not counts[field]:
                        del counts[field]
        for token in entry.masks:
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

    def explain(self, description: str, unit_ids: list[str]) -> dict[str, list[Evidence]]:
        """The words of the description each of these units contains, as their evidence."""
        terms = list(dict.fromkeys(tokens(description)))[:MAX_TERMS]
        with self._lock:
            term_scores = [self._matches(term) for term in terms]
            return {
                unit_id: self._units[unit_id].candidate(terms, term_scores, 0.0).evidence
                for unit_id in unit_ids
                if unit_id in self._units
            }

    def summary(self, unit_id: str) -> str | None:
        entry = self._units.get(unit_id)
        return entry.summary if entry is not None else None

    def _max_weight(self, token: str) -> float:
        return max(FIELD_WEIGHTS[field] for field in self._field_counts[token])

    def query(self, description: str, limit: int) -> list[Candidate]:
        """The best `limit` units by their matching words; when no word matches any unit, every unit ranked by
        shared letter trigrams (a misspelling, another word form) with a confidence of at most FALLBACK_CEILING,
        so that the answer is never empty while units exist and the summaries let the caller choose."""
        found = self.matches(description, limit)
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

    def matches(self, description: str, limit: int) -> list[Candidate]:
        """The best `limit` units some word of the description matches; none when no word matches."""
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


WEIGHTS_FILE = "l2_supercat_256.safetensors"
TOKENIZER_FILE = "l2_supercat_tokenizer_config.json"
NAME_FIELDS = frozenset(["unit_id", "symbol", "test", "route"])
"""The fields whose values a description names (the module and file names mostly repeat the unit id)."""
DOCUMENT_NAMES = frozenset(["unit_id", "symbol", "test", "route"])
DOCUMENT_TEXTS = frozenset(["docstring", "function_doc"])
MAX_DOCUMENT = 4000
"""Characters of a unit's document embedded at most (its names first, then its docstrings)."""
MAX_QUERY = 2000
"""Characters of a description ranked at most (the service cuts it there too)."""
MAX_QUERY_WORDS = 64
COMMON_NAME = 20
"""An identifier that more units than this share (`start`, `total`) names none of them: it lifts none."""
NAME_BOOST = 1.0
"""Added to the cosine of a unit whose identifier the description names, times the share of the description's
words the identifier covers (a misspelt word counts FUZZY_SHARE of a word)."""
FUZZY_SHARE = 0.7
LEXICAL_ONLY = "lexical: words only; install 'unit-mcp[meaning]' to rank by meaning"


def meaning_folder() -> Path | None:
    """The installed `wordllama` package folder when it holds the bundled weights and tokenizer and the
    libraries that read them are installed (found without importing anything)."""
    try:
        spec = importlib.util.find_spec("wordllama")
        if spec is None or not spec.submodule_search_locations:
            return None
        if any(importlib.util.find_spec(name) is None for name in ("numpy", "tokenizers", "safetensors")):
            return None
    except (ImportError, ValueError):
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    if (folder / "weights" / WEIGHTS_FILE).is_file() and (folder / "tokenizers" / TOKENIZER_FILE).is_file():
        return folder
    return None


class Embedder:
    """A static word embedding: a text's vector is the unit-length mean of its tokens' rows.

    wordllama's weights and tokenizer are read straight from its wheel. Its own loader is never called (it
    looks for the bundled tokenizer in the wrong folder and then downloads one), nor is its package imported
    (that configures the root logger). Texts are encoded one at a time: the tokenizer's batch encoding starts
    threads, and a process that forks afterwards gets a warning on stderr.
    """

    name = "wordllama l2_supercat 256-d"

    def __init__(self, folder: Path) -> None:
        import numpy as np
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self._np = np
        self._table = load_file(str(folder / "weights" / WEIGHTS_FILE))["embedding.weight"]
        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizers" / TOKENIZER_FILE))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self.dim = int(self._table.shape[1])

    def is_word(self, word: str) -> bool:
        """Whether the tokenizer knows the word whole (a common word, not a likely misspelling)."""
        return self._tokenizer.token_to_id("\u2581" + word) is not None

    def embed(self, texts: list[str]) -> Any:
        """One unit-length float32 row per text; zeros for a text with no token."""
        np = self._np
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            ids = self._tokenizer.encode(text, add_special_tokens=False).ids
            if ids:
                vector = np.mean(self._table[ids], axis=0, dtype=np.float32)
                norm = float(np.linalg.norm(vector))
                if norm > 0:
                    out[row] = vector / norm
        return out


_embedder_lock = threading.Lock()
_embedders: dict[Path, Embedder] = {}


def load_embedder(folder: Path) -> Embedder:
    """The process's one embedder of `folder`, loaded on first use (about 0.1 s, 16 MB)."""
    with _embedder_lock:
        if folder not in _embedders:
            _embedders[folder] = Embedder(folder)
        return _embedders[folder]


def unit_document(facts: UnitFacts) -> str:
    """What a unit's meaning is read from: its identifiers as words, then its docstrings. Module and file names
    are left out: they repeat the id, and a namespace every unit shares would pull all vectors one way."""
    names = [" ".join(tokens(value)) for field, value in facts.fields if field in DOCUMENT_NAMES]
    texts = [value for field, value in facts.fields if field in DOCUMENT_TEXTS]
    return (" ".join(name for name in names if name) + ". " + " ".join(texts)).strip(" .")[:MAX_DOCUMENT]


class MeaningIndex:
    """One unit-length vector per unit, the rows of one matrix: adding, changing or removing a unit touches one
    row (a removal moves the last row into its place), never the others. A changed unit's document waits until
    the next query, which embeds what waits in one pass: building the index for every unit costs no embedding
    until someone resolves, and the model loads then."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._embedder: Embedder | None = None
        self._pending: dict[str, str] = {}
        self._rows: dict[str, int] = {}
        self._ids: list[str] = []
        self._matrix: Any = None

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = load_embedder(self._folder)
            self._matrix = self._embedder._np.zeros((64, self._embedder.dim), dtype=self._embedder._np.float32)
        return self._embedder

    def update(self, unit_id: str, document: str | None) -> None:
        if document is None:
            self._pending.pop(unit_id, None)
            self._remove(unit_id)
        else:
            self._pending[unit_id] = document

    def flush(self) -> None:
        """Embed the documents that changed since the last query."""
        if not self._pending:
            return
        embedder = self.embedder
        vectors = embedder.embed(list(self._pending.values()))
        for unit_id, vector in zip(self._pending, vectors, strict=True):
            self._put(unit_id, vector)
        self._pending.clear()

    def _put(self, unit_id: str, vector: Any) -> None:
        row = self._rows.get(unit_id)
        if row is None:
            row = len(self._ids)
            if row == len(self._matrix):
                np = self.embedder._np
                self._matrix = np.concatenate([self._matrix, np.zeros_like(self._matrix)])
            self._ids.append(unit_id)
            self._rows[unit_id] = row
        self._matrix[row] = vector

    def _remove(self, unit_id: str) -> None:
        row = self._rows.pop(unit_id, None)
        if row is None:
            return
        last = len(self._ids) - 1
        if row != last:
            moved = self._ids[last]
            self._matrix[row] = self._matrix[last]
            self._ids[row] = moved
            self._rows[moved] = row
        self._ids.pop()
        self._matrix[last] = 0

    def vector(self, unit_id: str) -> Any:
        """A copy of the unit's vector (None for a unit not indexed)."""
        self.flush()
        row = self._rows.get(unit_id)
        return None if row is None else self._matrix[row].copy()

    def cosines(self, text: str) -> tuple[list[str], Any]:
        """Every unit's id and the cosine of its vector with the text's, row by row. einsum, not `@`: a
        matrix-vector product through BLAS starts its threads, which on a busy two-core machine took 10 to 30 ms
        at 10,000 units instead of under one."""
        self.flush()
        embedder = self.embedder
        query = embedder.embed([text])[0]
        return self._ids, embedder._np.einsum("ij,j->i", self._matrix[: len(self._ids)], query)

    def row(self, unit_id: str) -> int:
        return self._rows[unit_id]


def _words(text: str) -> list[str]:
    return [word.lower() for word in _SPLIT.split(_CAMEL.sub(" ", text)) if word]


def _deletes(word: str) -> set[str]:
    """The word and every string one deletion from it. Two words one edit apart (a letter deleted, inserted or
    replaced, two neighbours swapped) always share one of these (symmetric deletion), so a misspelt word finds
    its identifiers through a handful of lookups instead of the hundreds of strings one edit from it."""
    return {word, *(word[:i] + word[i + 1 :] for i in range(len(word)))}


def _one_edit(a: str, b: str) -> bool:
    """Whether a and b are at most one edit apart (Damerau: a swap of neighbouring letters is one edit)."""
    if a == b:
        return True
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (
            len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]
        )
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    i = 0
    while i < len(short) and short[i] == long_[i]:
        i += 1
    return short[i:] == long_[i + 1 :]


@dataclass(frozen=True)
class NameMatch:
    field: str
    value: str
    matched: tuple[str, ...]
    share: float


class NameIndex:
    """The identifiers of every unit (id, functions, classes, tests, routes) as word sequences, found in a
    description as consecutive words, each exactly or, for a word that may be misspelt, within one edit.

    A word may be misspelt when it has four letters or more and is not a known word (`known`: the embedding's
    vocabulary), so that "look" never stands for `lock` nor "times" for `timer`, while "tmer" stands for
    `timer`. Misspellings are found by symmetric deletion: each distinct first word of an identifier is kept
    under itself and every string one deletion from it (at most 34 keys, most leading to that one word, kept as
    the word itself), and a description's word looks up its own deletions: a few dozen lookups a word.
    """

    def __init__(self) -> None:
        self._units: dict[tuple[str, ...], dict[str, tuple[str, str]]] = {}  # words -> unit id -> (field, value)
        self._keys: dict[str, tuple[tuple[str, ...], ...]] = {}  # an identifier's first word -> identifiers
        self._near: dict[str, str | tuple[str, ...]] = {}  # a first word and each deletion from it -> first word(s)
        self._by_unit: dict[str, list[tuple[str, ...]]] = {}

    def update(self, unit_id: str, facts: UnitFacts | None) -> None:
        for words in self._by_unit.pop(unit_id, []):
            units = self._units[words]
            del units[unit_id]
            if not units:
                del self._units[words]
                _discard_key(self._keys, words[0], words)
                if words[0] not in self._keys:
                    for variant in _typo_keys(words[0]):
                        _unlink(self._near, variant, words[0])
        if facts is None:
            return
        mine: dict[tuple[str, ...], tuple[str, str]] = {}
        for field, value in facts.fields:
            if field not in NAME_FIELDS:
                continue
            words = tuple(map(sys.intern, _words(value)))
            if words and words not in mine:
                mine[words] = (field, value)
        for words, fact in mine.items():
            if words not in self._units:
                self._units[words] = {}
                if words[0] not in self._keys:
                    for variant in _typo_keys(words[0]):
                        _link(self._near, variant, words[0])
                self._keys[words[0]] = (*self._keys.get(words[0], ()), words)
            self._units[words][unit_id] = fact
        self._by_unit[unit_id] = list(mine)

    def named(self, description: str, known: Callable[[str], bool]) -> dict[str, list[NameMatch]]:
        """The units whose identifiers the description names, with each match and the share of the
        description's words it covers."""
        words = _words(description)[:MAX_QUERY_WORDS]
        content = [len(word) >= 2 and word not in STOPWORDS for word in words]
        total = sum(content) or len(words)
        typo = [len(word) >= 4 and not word.isdigit() and not known(word) for word in words]
        found: dict[str, list[NameMatch]] = {}
        for start, word in enumerate(words):
            candidates = set(self._keys.get(word, ()))
            if typo[start] and len(word) <= 32:
                near = {key for variant in _deletes(word) for key in _linked(self._near, variant)}
                for key in near:
                    if key != word and _one_edit(word, key):
                        candidates.update(self._keys[key])
            for name in candidates:
                span = words[start : start + len(name)]
                if len(span) != len(name) or len(self._units[name]) > COMMON_NAME:
                    continue
                if not all(
                    a == b or (typo[start + i] and len(b) >= 4 and _one_edit(a, b))
                    for i, (a, b) in enumerate(zip(span, name, strict=True))
                ):
                    continue
                share = sum(
                    (1.0 if a == b else FUZZY_SHARE)
                    for a, b, counts in zip(span, name, content[start:], strict=False)
                    if counts or not any(content)
                )
                for unit_id, (field, value) in self._units[name].items():
                    found.setdefault(unit_id, []).append(NameMatch(field, value, tuple(span), share / total))
        return found


def _typo_keys(word: str) -> set[str]:
    """The deletion keys of an identifier's first word in the typo index: none for a word no misspelling may
    stand for (a misspelt word has 4 to 32 letters, so a word one edit from it has 3 to 33), which bounds the
    index at 34 keys a distinct first word."""
    return _deletes(word) if 3 <= len(word) <= 33 else set()


def _link(index: dict[str, str | tuple[str, ...]], key: str, word: str) -> None:
    """Add `word` under `key`: most keys lead to one word, kept as the string itself rather than a set of one
    (a set costs 216 bytes; the index holds up to 34 keys for each distinct first word)."""
    held = index.get(key)
    if held is None:
        index[key] = word
    elif isinstance(held, str):
        if held != word:
            index[key] = (held, word)
    elif word not in held:
        index[key] = (*held, word)


def _unlink(index: dict[str, str | tuple[str, ...]], key: str, word: str) -> None:
    held = index.get(key)
    if held is None or held == word:
        index.pop(key, None)
    elif isinstance(held, tuple) and word in held:
        left = tuple(other for other in held if other != word)
        index[key] = left[0] if len(left) == 1 else left


def _linked(index: dict[str, str | tuple[str, ...]], key: str) -> tuple[str, ...]:
    held = index.get(key)
    return () if held is None else (held,) if isinstance(held, str) else held


def _discard_key(index: dict[str, tuple[tuple[str, ...], ...]], key: str, words: tuple[str, ...]) -> None:
    """Forget one identifier under its first word (a tuple, not a set: most first words start one identifier)."""
    held = index[key]
    at = held.index(words)
    names = held[:at] + held[at + 1 :]
    if names:
        index[key] = names
    else:
        del index[key]


class ResolveIndex:
    """What unit_resolve ranks with, kept current one unit at a time (`update` after each reload).

    With the `meaning` extra, units are ranked by the cosine of their document's embedding with the
    description's, lifted by the identifiers the description names (NAME_BOOST): a description that names a
    unit, a function or a test finds it first, even misspelt; a paraphrase finds it by meaning. The words a
    unit contains (the lexical index) are shown as evidence but do not lift it: on the paraphrase sets even a
    quarter of their weight cost held-out answers (prefix and substring matches) and won none. Without the
    extra, the lexical index answers alone. Every candidate's first evidence line says which ranker answered
    and the cosine. Never empty while units exist.
    """

    def __init__(self, *, meaning: bool = True) -> None:
        self._lock = threading.Lock()
        self._lexical = LexicalIndex()
        folder = meaning_folder() if meaning else None
        self._meaning = MeaningIndex(folder) if folder is not None else None
        self._names = NameIndex() if self._meaning is not None else None  # the lexical ranker reads none

    def __len__(self) -> int:
        return len(self._lexical)

    def __contains__(self, unit_id: object) -> bool:
        return unit_id in self._lexical

    @property
    def ranker(self) -> str:
        return "meaning" if self._meaning is not None else "lexical"

    def update(self, unit_id: str, facts: UnitFacts | None) -> None:
        """Index a unit's current facts, or forget the unit (None). The unit's vector is computed at the next
        query (or `flush`)."""
        with self._lock:
            self._lexical.update(unit_id, facts)
            if self._names is not None:
                self._names.update(unit_id, facts)
            if self._meaning is not None:
                self._meaning.update(unit_id, None if facts is None else unit_document(facts))

    def flush(self) -> None:
        """Embed every unit changed since the last query now (a query does it anyway)."""
        with self._lock:
            if self._meaning is not None:
                self._meaning.flush()

    def vector(self, unit_id: str) -> Any:
        with self._lock:
            return None if self._meaning is None else self._meaning.vector(unit_id)

    def query(self, description: str, limit: int) -> list[Candidate]:
        description = description[:MAX_QUERY]
        if limit <= 0:
            return []
        if self._meaning is None or self._names is None:
            ranker = Evidence(field="ranker", value=LEXICAL_ONLY, matched=[])
            return [_with_first(c, ranker) for c in self._lexical.query(description, limit)]
        with self._lock:
            return self._query(self._meaning, self._names, description, limit)

    def _query(self, meaning: MeaningIndex, names: NameIndex, description: str, limit: int) -> list[Candidate]:
        if not len(self._lexical):
            return []
        ids, cosines = meaning.cosines(" ".join(tokens(description)) or description)
        named = names.named(description, meaning.embedder.is_word)
        scores = cosines.copy()
        for unit_id, matches in named.items():
            scores[meaning.row(unit_id)] += NAME_BOOST * min(1.0, sum(m.share for m in matches))
        np = meaning.embedder._np
        if len(ids) > limit:
            cut = float(np.partition(scores, len(ids) - limit)[len(ids) - limit])
            chosen = np.flatnonzero(scores >= cut)
        else:
            chosen = np.arange(len(ids))
        best = sorted((-float(scores[row]), ids[row], int(row)) for row in chosen)[:limit]
        words = self._lexical.explain(description, [unit_id for _, unit_id, _ in best])
        out = []
        for negative, unit_id, row in best:
            cosine = f"meaning: cosine {float(cosines[row]):.3f} ({Embedder.name})"
            evidence = [Evidence(field="ranker", value=cosine, matched=[])]
            seen = set()
            word_evidence = words.get(unit_id, [])
            for item in word_evidence:
                seen.add((item.field, item.value))
            for match in named.get(unit_id, []):
                if (match.field, match.value) not in seen:
                    seen.add((match.field, match.value))
                    evidence.append(Evidence(field=match.field, value=match.value, matched=list(match.matched)))
            evidence.extend(word_evidence)
            out.append(
                Candidate(
                    unit_id=unit_id,
                    confidence=round(min(max(-negative, 0.0), 1.0), 3),
                    evidence=evidence[:MAX_EVIDENCE],
                    summary=self._lexical.summary(unit_id),
                )
            )
        return out


def _with_first(candidate: Candidate, evidence: Evidence) -> Candidate:
    return candidate.model_copy(update={"evidence": [evidence, *candidate.evidence][:MAX_EVIDENCE]})
