"""Hostile source ids sent through unit_read_source, unit_apply_patch and unit_create_source over real HTTP.

Nothing outside the unit may be read (sentinel secrets never appear in a response and their access times do not
move) or written (the whole tree around the unit is fingerprinted before and after), every refusal is an
`isError` result with a stable code, and no message carries an absolute path of the host.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.server_process import ServerProcess

from unit_mcp import Host, paths
from unit_mcp.errors import InvalidSourceId

from .attack import HOSTILE_UNIT_IDS, Ground, hostile_source_ids, plant
from .clients import call, connect, host_paths, leaks, visible
from .conftest import Served
from .report import Report
from .rpc import RawMcp, ToolOutcome

# What a refusal of a hostile id may say: the id is malformed, names nothing, names a link or a folder, or
# (create only) names an entry that is already there. Anything else - above all a success - is a failure.
REFUSALS = {"invalid_source_id", "unknown_source", "exists", "not_supported"}
UNIT_REFUSALS = {"invalid_unit_id", "unknown_unit", *REFUSALS}


def attempts(unit: str, source_id: str) -> list[tuple[str, dict[str, Any]]]:
    """The three tools that take a source id, each asked to touch `source_id` of `unit`."""
    return [
        ("unit_read_source", {"unit_id": unit, "source_id": source_id}),
        ("unit_apply_patch", {"unit_id": unit, "source_id": source_id, "old": "SECRET", "new": "PWNED"}),
        ("unit_create_source", {"unit_id": unit, "source_id": source_id, "source": "PWNED = True\n"}),
    ]


def check_refusal(result: ToolOutcome, allowed: set[str], forbidden: list[str], what: str) -> None:
    assert result.is_error, f"{what} was not refused: {result.text[:300]}"
    assert result.code in allowed, f"{what} refused with {result.code!r}: {result.text[:300]}"
    assert result.text.startswith(f"[{result.code}] "), f"{what}: the text does not lead with its code"
    assert "Hint: " in result.text, f"{what}: the refusal has no hint"
    found = leaks([visible(result)], forbidden)
    assert not found, f"{what} leaked {found}: {result.text[:300]}"


def assert_nothing_escaped(ground: Ground, before: dict[str, str]) -> None:
    assert ground.read_sentinels() == [], "a file outside the unit was read"
    after = ground.tree()
    changed = sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key))
    assert changed == [], f"entries changed, appeared or vanished: {changed}"


@pytest.fixture
def ground(tmp_path: Path, units_root: Path, host: Host) -> Ground:
    planted = plant(tmp_path, units_root)
    assert planted.atime_probe_works(), "this filesystem does not update access times; reads cannot be detected"
    return planted


@pytest.mark.anyio
async def test_hostile_source_ids_are_refused_and_nothing_outside_is_touched(
    served: Served, ground: Ground, figures: Report
) -> None:
    corpus = hostile_source_ids(ground)
    assert len(corpus) >= 200
    for category, source_id in corpus:  # malformed by construction, but for the links and special files
        if category not in ("symlink", "special_file"):
            with pytest.raises(InvalidSourceId):
                paths.validate_source_id(source_id)
    forbidden = [*host_paths(ground.root), ground.secret]
    before = ground.tree()
    ground.arm()
    codes: collections.Counter[str] = collections.Counter()
    per_category: collections.Counter[str] = collections.Counter()
    started = time.perf_counter()
    plans: list[tuple[str, set[str], str, dict[str, Any]]] = []
    for category, source_id in corpus:
        per_category[category] += 1
        expected = REFUSALS if category in ("symlink", "special_file") else {"invalid_source_id"}
        plans += [
            (f"{name}(counter, {source_id!r})", expected, name, args) for name, args in attempts("counter", source_id)
        ]
        greeter = {"unit_id": "greeter", "source_id": source_id}  # the file unit: its one source, nothing else
        plans.append((f"unit_read_source(greeter, {source_id!r})", REFUSALS, "unit_read_source", greeter))
    for unit_id in HOSTILE_UNIT_IDS:
        plans += [
            (f"{name}({unit_id!r})", UNIT_REFUSALS, name, args) for name, args in attempts(unit_id, "__init__.py")
        ]
    async with connect(served.url, served.token) as client:
        limit = anyio.Semaphore(8)

        async def attempt(what: str, expected: set[str], name: str, arguments: dict[str, Any]) -> None:
            async with limit:
                result = await call(client, name, arguments)
            check_refusal(result, expected, forbidden, what)
            codes[f"{result.code}"] += 1

        async with anyio.create_task_group() as group:
            for plan in plans:
                group.start_soon(attempt, *plan)
        calls = len(plans)
        assert not (await call(client, "unit_list", {})).is_error, "the server keeps serving"
    elapsed = time.perf_counter() - started
    assert_nothing_escaped(ground, before)
    figures.record(
        "paths",
        hostile_source_ids=len(corpus),
        by_category=dict(sorted(per_category.items())),
        hostile_unit_ids=len(HOSTILE_UNIT_IDS),
        tool_calls=calls,
        refused=sum(codes.values()),
        refusal_codes=dict(codes.most_common()),
        successes=0,
        outside_reads=0,
        outside_writes=0,
        host_paths_in_messages=0,
        read_detection="sentinel secrets in responses + atime (probe verified)",
        seconds=round(elapsed, 2),
    )


class Swapper:
    """Flips entries of the unit between a real file or folder and a symlink to the outside, as fast as it can."""

    def __init__(self, ground: Ground) -> None:
        self.ground = ground
        self.stop = threading.Event()
        self.flips = 0
        self.thread = threading.Thread(target=self.run, name="swapper", daemon=True)

    def __enter__(self) -> Swapper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)

    def run(self) -> None:
        inside = self.ground.unit_dir
        outside = self.ground.outside
        target, parked = inside / "swap", inside / ".swap-parked"
        while not self.stop.is_set():
            (inside / ".swapfile.tmp").write_text("INSIDE\n")
            os.replace(inside / ".swapfile.tmp", inside / "swapfile.txt")  # a regular file
            os.symlink(outside / "secret.txt", inside / ".swaplink.tmp")
            os.replace(inside / ".swaplink.tmp", inside / "swapfile.txt")  # the same name, now a link out
            try:
                os.rename(target, parked)  # the real folder steps aside ...
                os.symlink(outside, target)  # ... a link to the outside takes its place ...
                time.sleep(0.0005)
                os.unlink(target)
                os.rename(parked, target)  # ... and the real folder comes back
            except OSError:  # a create through the tools may have made `swap` a new real folder meanwhile
                if target.is_dir() and not target.is_symlink():
                    os.rename(target, inside / f".swap-stray-{self.flips}")
                if parked.exists() and not target.exists():
                    os.rename(parked, target)
            self.flips += 1
            time.sleep(0.0005)


@pytest.mark.anyio
async def test_a_symlink_swapped_in_between_check_and_open_never_redirects(
    served: Served, ground: Ground, figures: Report
) -> None:
    (ground.unit_dir / "swap").mkdir()
    (ground.unit_dir / "swap" / "x.txt").write_text("INSIDE\n")
    (ground.unit_dir / "swapfile.txt").write_text("INSIDE\n")
    forbidden = [*host_paths(ground.root), ground.secret]
    outside_before = {key: value for key, value in ground.tree().items() if key.startswith("outside")}
    ground.arm()
    outcomes: collections.Counter[str] = collections.Counter()
    async with connect(served.url, served.token) as client:
        with Swapper(ground) as swapper:
            for round_ in range(80):
                for name, arguments in [
                    ("unit_read_source", {"unit_id": "counter", "source_id": "swapfile.txt"}),
                    ("unit_read_source", {"unit_id": "counter", "source_id": "swap/x.txt"}),
                    (
                        "unit_apply_patch",
                        {"unit_id": "counter", "source_id": "swapfile.txt", "old": "INSIDE", "new": "INSIDE!"},
                    ),
                    (
                        "unit_apply_patch",
                        {"unit_id": "counter", "source_id": "swap/x.txt", "old": "INSIDE", "new": "IN"},
                    ),
                    (
                        "unit_create_source",
                        {"unit_id": "counter", "source_id": f"swap/new_{round_}.txt", "source": "x"},
                    ),
                ]:
                    result = await call(client, name, arguments)
                    assert not leaks([visible(result)], forbidden), f"{name} leaked: {result.text[:300]}"
                    if result.is_error:
                        assert result.code in {*REFUSALS, "no_match", "internal_error"}, result.text[:300]
                        outcomes[f"{name}: refused [{result.code}]"] += 1
                    else:
                        outcomes[f"{name}: served inside"] += 1
                        if name == "unit_read_source":
                            assert result.structured and result.structured["content"].startswith("IN")
        flips = swapper.flips
    assert ground.read_sentinels() == [], "a file outside the unit was read"
    assert {key: value for key, value in ground.tree().items() if key.startswith("outside")} == outside_before
    served_inside = sum(count for key, count in outcomes.items() if "served inside" in key)
    refused_as_link = sum(count for key, count in outcomes.items() if "invalid_source_id" in key)
    assert served_inside > 0 and refused_as_link > 0, f"the race was not exercised both ways: {dict(outcomes)}"
    figures.record(
        "paths_race",
        flips=flips,
        tool_calls=sum(outcomes.values()),
        served_from_inside=served_inside,
        refused_as_symlink=refused_as_link,
        outcomes=dict(sorted(outcomes.items())),
        outside_reads=0,
        outside_writes=0,
    )
    unexplained = {key: count for key, count in outcomes.items() if "internal_error" in key}
    assert not unexplained, f"a path swapped mid-call must be refused with a code, not {unexplained}"


# -- Hypothesis: ids made of the pieces attacks are made of ----------------------------------------------

PIECES = [
    "..", ".", "/", "//", "\\", "%2e", "%2f", "%5c", "%252e", "%00", "\x00", "\u2024", "\uff0e", "\u2215",
    "\uff0f", "\u2044", "\u2025", "\u200b", "~", " ", ":", "*", "\n", "link_out", "link_up", "link_root",
    "link_sibling", "deep", "evil.py", "dangling.py", "pipe.py", "counter_evil", "counter", "outside", "secret.txt",
    "secret.py", "__init__.py", "x.py", "etc", "passwd", "units_evil", "a" * 250,
]  # fmt: skip
SOURCE_IDS = st.one_of(
    st.lists(st.sampled_from(PIECES) | st.text(max_size=6), min_size=1, max_size=10).map("".join),
    st.text(max_size=40),
    st.lists(st.sampled_from(PIECES), min_size=1, max_size=6).map("/".join),
)


def inside_and_plain(ground: Ground, source_id: str) -> bool:
    """Whether an id names a place inside the unit reached without any symlink: the only kind that may succeed."""
    try:
        segments = paths.validate_source_id(source_id)
    except InvalidSourceId:
        return False
    probe = ground.unit_dir
    for segment in segments:
        probe = probe / segment
        if probe.is_symlink():
            return False
    return True


def test_hypothesis_source_ids_through_the_tools(
    tmp_path: Path, units_root: Path, server_processes: list[ServerProcess], figures: Report
) -> None:
    """A sync property test: `python -m unit_mcp.server` in a child process, driven by a raw JSON-RPC client.

    (The server runs in a process of its own because Hypothesis reads the source of local modules loaded in
    its process for constants, and the units - the sibling unit with its sentinel among them - would be.)"""
    ground = plant(tmp_path, units_root)
    assert ground.atime_probe_works()
    forbidden = [*host_paths(ground.root), ground.secret]
    stats: collections.Counter[str] = collections.Counter()
    process = ServerProcess(
        "--units", str(units_root), "--data-dir", str(tmp_path / "data"), "--no-watch", tmp=tmp_path
    )
    server_processes.append(process)
    printed = process.ready()
    with RawMcp(printed["MCP_URL"], printed["MCP_TOKEN"]) as client:
        before = {key: value for key, value in ground.tree().items() if not key.startswith(f"units/{ground.unit}/")}
        ground.arm()

        @settings(
            max_examples=150,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(source_id=SOURCE_IDS)
        def probe(source_id: str) -> None:
            # The JSON layer cannot carry lone surrogates: they are the transport tests' business.
            source_id = source_id.encode("utf-8", "replace").decode("utf-8")
            for name, arguments in attempts("counter", source_id):
                result = client.call(name, arguments)
                stats["calls"] += 1
                assert not leaks([visible(result)], forbidden), f"{name}({source_id!r}) leaked: {result.text[:300]}"
                if result.is_error:
                    assert result.code in {*REFUSALS, "no_match", "syntax_error", "invalid_argument"}, result.text
                    assert result.text.startswith(f"[{result.code}] ")
                    stats["refused"] += 1
                    continue
                assert inside_and_plain(ground, source_id), f"{name}({source_id!r}) succeeded: {result.text[:300]}"
                stats["served_inside"] += 1
                if name == "unit_create_source":
                    created = ground.unit_dir / source_id
                    assert created.is_file() and not created.is_symlink()
                    created.unlink()

        probe()
        assert ground.read_sentinels() == [], "a file outside the unit was read"
        after = {key: value for key, value in ground.tree().items() if not key.startswith(f"units/{ground.unit}/")}
        assert after == before, "something outside the unit changed"
        assert client.call("unit_list", {}).is_error is False
    figures.record(
        "paths_hypothesis",
        examples=150,
        tool_calls=stats["calls"],
        refused=stats["refused"],
        served_inside_the_unit=stats["served_inside"],
        outside_reads=0,
        outside_writes=0,
        client="raw JSON-RPC over httpx (no SDK)",
    )
