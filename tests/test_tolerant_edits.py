"""Tolerant matching through the tool (`unit_apply_patch`): a loose match that fits one place is applied and says
which matcher found it and where; a miss answers the nearest places and the current hash, so the retry needs no read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import copy_units

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
