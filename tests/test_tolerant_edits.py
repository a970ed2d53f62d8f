"""Tolerant matching through the tool (`unit_apply_patch`): a loose match that fits one place is applied and says
which matcher found it and where; a miss answers the nearest places and the current hash, so the retry needs no read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import copy_units, root_of

from unit_mcp import Host, UnitService
from unit_mcp.errors import UnitError


@pytest.fixture
def service(tmp_path: Path) -> Iterator[UnitService]:
    with Host(copy_units(tmp_path / "units"), tmp_path / "data") as host:
        yield UnitService(host)


def test_a_reindented_old_is_applied_and_says_so(service: UnitService) -> None:
    old = "global count\ncount += step\n"  # the lines of increment() without their indentation
    new = "global count\ncount += 2 * step\n"
    result = service.apply_patch("counter", "__init__.py", old=old, new=new)
    assert result.match == "reindented" and result.matched_lines and result.changed
    assert "        count += 2 * step" not in service.read_source("counter", "__init__.py").content
    assert "    count += 2 * step\n" in service.read_source("counter", "__init__.py").content
    assert service.host.module("counter").increment() == 2


def test_a_miss_carries_the_nearest_place_and_the_hash_for_a_retry_without_reading(service: UnitService) -> None:
    read = service.read_source("counter", "__init__.py")
    with pytest.raises(UnitError) as caught:
        service.apply_patch("counter", "__init__.py", old="    count += stepp\n    log.info('x')\n", new="pass\n")
    refusal = caught.value
    assert refusal.code == "no_match" and refusal.details["current_hash"] == read.hash
    nearest = refusal.details["candidates"][0]
    assert "count += step" in nearest["text"] and nearest["lines"]
    fixed = nearest["text"].replace("count += step", "count += 3 * step")
    retried = service.apply_patch(
        "counter", "__init__.py", old=nearest["text"], new=fixed, expected_hash=refusal.details["current_hash"]
    )
    assert retried.match == "exact" and retried.changed and service.host.module("counter").increment() == 3


def test_a_patch_whose_reload_fails_shows_the_attempted_line_10_and_the_units_frame_only(service: UnitService) -> None:
    """Issue 37's first try: a NameError at import time on line 10 was shown with the rolled-back line's text."""
    lines = [f"step_{n} = {n}\n" for n in range(1, 10)] + ["limits = {}\n", "step = 1\n"]
    (root_of(service.host) / "limits").mkdir()
    (root_of(service.host) / "limits" / "__init__.py").write_text("".join(lines))
    service.reload("limits")
    before = service.read_source("limits", "__init__.py")
    with pytest.raises(UnitError) as refused:
        service.apply_patch(
            "limits", "__init__.py", old="limits = {}\n", new="limits = load_limits()\n", expected_hash=before.hash
        )
    trace = str((refused.value.details or {})["traceback"])
    assert "line 10" in trace and "limits = load_limits()" in trace, trace
    assert "step = 1" not in trace, "the line shown is the one attempted, not the one put back"
    assert "NameError: name 'load_limits' is not defined" in trace
    frames = [line for line in trace.splitlines() if line.strip().startswith("File ")]
    assert frames == ['  File "<units>/limits/__init__.py", line 10, in <module>'], "only the unit's frames, redacted"
    assert service.read_source("limits", "__init__.py").content == before.content
