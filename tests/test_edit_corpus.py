"""The edit corpus (issue 37) on a sample: real edits from this repository's history, perturbed the ways agents get
them wrong, applied with exactly the intended bytes or refused with what a retry needs; never misapplied.
`scripts/bench.py --only edits` runs all of it, beside the exact-only matcher."""

from __future__ import annotations

import random

from support.edit_corpus import cases, evaluate, load, pinned

SAMPLE = 60


def test_a_sample_of_the_corpus_applies_right_or_refuses_with_a_retry_that_works() -> None:
    edits, pins = load()
    assert len(edits) >= 2000
    sample = random.Random(37).sample(edits, SAMPLE)
    for edit in sample:  # the cases derived now are the ones the data file pinned
        for case in cases(edit):
            assert pinned(case) == pins[case.id], case.id
    total, by, wrong = evaluate(sample)
    figures = total.figures()
    assert wrong == [], [case.id for case, _ in wrong]
    assert figures["first_try"] >= 0.99, by
    assert figures["refused_with_candidate"] == figures["refused"]
    assert figures["retry_right"] >= 0.9, by
    assert figures["refusal_bytes_max"] <= 8000
