"""Every tool with missing, mistyped, oversized (10 MB), empty and binary-ish arguments, over HTTP: each is an
`isError` result that leads with a code and names what to fix, nothing is written, and the server keeps
serving. Lone surrogates cannot be carried by JSON text at all: the protocol layer refuses them."""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from unit_mcp.tools import TOOLS

from .clients import call, connect, host_paths, leaks, visible
from .conftest import Served
from .report import Report
from .rpc import RawMcp, messages

pytestmark = pytest.mark.anyio

TEN_MB = "x" * (10 * 1024 * 1024)
OK = "ok"  # a harmless success: free text that any value may hold

# A valid call of every tool; each case changes one argument of it. Edits are dry runs and tests have a short
# timeout, so that a case that wrongly succeeded would still do no harm.
VALID: dict[str, dict[str, Any]] = {
    "unit_list": {},
    "unit_resolve": {"description": "counter"},
    "unit_inspect": {"unit_id": "counter"},
    "unit_read_source": {"unit_id": "counter", "source_id": "__init__.py"},
    "unit_apply_patch": {"unit_id": "counter", "source_id": "__init__.py", "old": "step = 1", "new": "step = 2",
                         "dry_run": True},
    "unit_create_source": {"unit_id": "counter", "source_id": "fresh.py", "source": "X = 1\n"},
    "unit_run_tests": {"unit_id": "counter", "test_name": "nonesuch", "timeout": 5},
    "unit_reload": {"unit_id": "counter"},
    "unit_read_log": {"lines": 5},
    "unit_snapshot": {"unit_id": "counter"},
    "unit_changes": {"unit_id": "counter", "limit": 5},
    "unit_checkpoint": {"label": "bad arguments"},
    "unit_rollback": {"checkpoint_id": 1, "dry_run": True},
    "unit_revert_change": {"change_id": 1, "dry_run": True},
    "unit_restore_snapshot": {"unit_id": "counter", "snapshot_id": "snap-000000000000"},
    "unit_test_status": {"run_id": "nosuch", "wait_s": 0},
    "unit_cancel_test": {"run_id": "nosuch"},
}  # fmt: skip

# What an argument that is wrong in each way must give, by argument name (default: invalid_argument).
EXPECTED: dict[tuple[str, str], str | set[str]] = {
    ("oversized", "unit_id"): "invalid_unit_id",
    ("oversized", "source_id"): "invalid_source_id",
    ("oversized", "patch"): "too_large",
    ("oversized", "old"): "too_large",
    ("oversized", "new"): "too_large",
    ("oversized", "source"): "too_large",
    ("oversized", "description"): OK,  # ranked on its first 2,000 characters
    ("empty", "unit_id"): "invalid_unit_id",
    ("empty", "source_id"): "invalid_source_id",
    ("empty", "old"): {"invalid_argument", "no_match"},
    ("empty", "new"): OK,  # deletes `old`
    ("empty", "source"): OK,  # an empty file
    ("empty", "grep"): OK,  # no filter
    ("empty", "label"): OK,  # a checkpoint's free-text label
    ("binary", "label"): OK,
    ("binary", "unit_id"): "invalid_unit_id",
    ("binary", "source_id"): "invalid_source_id",
    ("binary", "description"): OK,
    ("binary", "grep"): OK,
    ("binary", "old"): "no_match",
    ("binary", "new"): "binary_source",  # a source cannot hold NUL
    ("binary", "source"): "binary_source",
    ("binary", "patch"): "invalid_patch",
    ("empty", "run_id"): "unknown_run",
    ("binary", "run_id"): "unknown_run",
}
MISTYPED: dict[str, list[Any]] = {
    "str": [5, 1.5, True, [], {"a": 1}],
    "int": ["ten", 1.5, [], {}, 10**30, -1],
    "bool": ["maybe", 2, [], {}],
    "float": ["fast", [], {}, -1, 0, 1e12],
    "seconds": ["fast", [], {}, -1, 1e12],  # 0 is a valid wait
    "list": ["counter", 5, {}, [5], []],
}
KINDS = {"unit_id": "str", "source_id": "str", "description": "str", "patch": "str", "old": "str", "new": "str",
         "expected_hash": "str", "source": "str", "test_name": "str", "grep": "str", "limit": "int", "lines": "int",
         "offset": "int", "before": "int", "replace_all": "bool", "dry_run": "bool", "timeout": "float", "since": "str",
         "cursor": "str", "label": "str", "checkpoint_id": "int", "change_id": "int", "force": "bool",
         "snapshot_id": "str", "wait": "bool", "run_id": "str", "wait_s": "seconds", "test": "str",
         "unit_ids": "list", "with_state": "bool"}  # fmt: skip


def cases() -> list[tuple[str, str, str, dict[str, Any], str | set[str]]]:
    """(tool, way, argument, arguments, expected code or OK) for every tool and argument."""
    out: list[tuple[str, str, str, dict[str, Any], str | set[str]]] = []
    for spec in TOOLS:
        valid = VALID[spec.name]
        out.append((spec.name, "unknown", "expected_hsh", {**valid, "expected_hsh": "sha256:0"}, "invalid_argument"))
        for name, field in spec.args.model_fields.items():
            if name == "patch":  # the other editing mode: without old/new
                valid = {key: value for key, value in VALID[spec.name].items() if key not in ("old", "new")}
            else:
                valid = VALID[spec.name]
            if field.is_required():
                missing = {key: value for key, value in valid.items() if key != name}
                out.append((spec.name, "missing", name, missing, "invalid_argument"))
            kind = KINDS[name]
            for value in MISTYPED[kind]:
                out.append((spec.name, "mistyped", name, {**valid, name: value}, "invalid_argument"))
            if kind == "str":
                for way, value in [("oversized", TEN_MB), ("empty", ""), ("binary", "a\x00b")]:
                    if name == "new" and way == "binary":
                        value = "step = 1\x00"  # a NUL inside code
                    expected = EXPECTED.get((way, name), "invalid_argument")
                    out.append((spec.name, way, name, {**valid, name: value}, expected))
    for number, (tool, _, name, arguments, _) in enumerate(out):
        if tool == "unit_create_source" and name != "source_id" and "source_id" in arguments:
            arguments["source_id"] = f"fresh_{number}.py"  # a case that wrongly succeeds cannot make the next `exists`
    return out


async def test_bad_arguments_to_every_tool_are_refused_with_what_to_fix(
    served: Served, units_root: Path, figures: Report
) -> None:
    before = {path: path.read_bytes() for path in (units_root / "counter").rglob("*") if path.is_file()}
    tally: collections.Counter[str] = collections.Counter()
    codes: collections.Counter[str] = collections.Counter()
    started = time.perf_counter()
    planned = cases()
    forbidden = host_paths(units_root.parent)
    async with connect(served.url, served.token) as client:
        for number, (tool, way, name, arguments, expected) in enumerate(planned):
            result = await call(client, tool, arguments)
            what = f"{tool} with {way} {name}"
            tally[way] += 1
            if expected == OK:
                assert not result.is_error, f"{what}: {result.text[:300]}"
                tally["harmless successes"] += 1
                continue
            allowed = expected if isinstance(expected, set) else {expected}
            assert result.is_error, f"{what} was accepted"
            assert result.code in allowed, f"{what}: [{result.code}] {result.text[:300]}"
            assert result.text.startswith(f"[{result.code}] ") and "Hint: " in result.text, what
            if result.code == "invalid_argument" and way in ("missing", "mistyped", "unknown"):
                assert name in result.text, f"{what}: the message does not name the argument: {result.text[:300]}"
            assert len(result.text) < 4000, f"{what}: the refusal echoes the argument ({len(result.text)} chars)"
            assert not leaks([visible(result)], forbidden), f"{what}: a host path in {result.text[:300]}"
            codes[result.code or "?"] += 1
            if number % 25 == 0:
                assert not (await call(client, "unit_list", {})).is_error, "the server keeps serving"
        assert not (await call(client, "unit_list", {})).is_error
    created = sorted(p.name for p in (units_root / "counter").glob("fresh_*.py"))
    after = {path: path.read_bytes() for path in before}
    assert after == before, "no existing source was changed"
    elapsed = time.perf_counter() - started
    figures.record(
        "bad_arguments",
        tools=len(TOOLS),
        calls=len(planned),
        refused=sum(codes.values()),
        by_way={way: count for way, count in sorted(tally.items()) if way != "harmless successes"},
        harmless_successes=tally["harmless successes"],
        harmless_successes_are="free text (a 10 MB or NUL description or grep, an empty `new` or file)",
        refusal_codes=dict(codes.most_common()),
        files_created_by_valid_empty_source=len(created),
        existing_sources_changed=0,
        seconds=round(elapsed, 2),
    )


async def test_what_json_cannot_carry_is_refused_by_the_protocol_layer(served: Served, figures: Report) -> None:
    """Lone surrogates, and `arguments` that are not an object, never reach a tool: a JSON-RPC error, then
    the same session goes on working."""

    def run() -> dict[str, Any]:
        refused: dict[str, Any] = {}
        with RawMcp(served.url, served.token) as raw:
            for label, tool, arguments in [
                ("lone high surrogate in source_id", "unit_read_source", '{"unit_id":"counter","source_id":"\\ud800"}'),
                ("lone low surrogate in old", "unit_apply_patch", '{"unit_id":"counter","old":"\\udc00","new":""}'),
                ("arguments is a list", "unit_read_source", '["counter"]'),
                ("arguments is a string", "unit_read_source", '"counter"'),
            ]:
                params = f'{{"name":"{tool}","arguments":{arguments}}}'
                text = f'{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{params}}}'
                response = raw.post(text)
                [message] = messages(response)
                assert "error" in message and message["error"]["code"] in (-32700, -32602), message
                refused[label] = f"HTTP {response.status_code}, JSON-RPC {message['error']['code']}"
                assert not raw.call("unit_list", {}).is_error, "the session keeps working"
        return refused

    refused = await anyio.to_thread.run_sync(run)
    figures.record("bad_arguments", refused_before_any_tool=refused)


async def test_a_write_that_would_make_a_text_source_binary_is_refused(served: Served, units_root: Path) -> None:
    (units_root / "weather" / "readme.txt").write_text("hello\n")
    async with connect(served.url, served.token) as client:
        created = await call(
            client, "unit_create_source", {"unit_id": "weather", "source_id": "notes.txt", "source": "a\x00b"}
        )
        patched = await call(
            client,
            "unit_apply_patch",
            {"unit_id": "weather", "source_id": "readme.txt", "old": "hello", "new": "hel\x00lo"},
        )
    assert created.is_error and patched.is_error, "NUL was written into a text source the tools then refuse to read"


async def test_no_argument_can_forge_or_flood_the_app_log(served: Served, figures: Report) -> None:
    """Every call is logged with its unit and source ids; a hostile id must not start a line of its own or
    bloat the log (the log is readable back through unit_read_log)."""
    forged = "x.py\n2026-01-01 00:00:00,000 INFO units.counter: FORGED by an argument"
    async with connect(served.url, served.token) as client:
        for arguments in [
            {"unit_id": "counter", "source_id": forged},
            {"unit_id": forged.replace(".py", ""), "source_id": "__init__.py"},
            {"unit_id": "counter", "source_id": "x\u2028INFO units.counter: FORGED too"},
            {"unit_id": "counter", "source_id": "y" * 100_000},
        ]:
            assert (await call(client, "unit_read_source", arguments)).is_error
        log = await call(client, "unit_read_log", {"grep": "FORGED", "lines": 50})
        tail = await call(client, "unit_read_log", {"lines": 20})
    assert log.structured is not None and tail.structured is not None
    assert all(" call unit_read_source " in line for line in log.structured["lines"]), log.structured["lines"]
    longest = max(len(line) for line in tail.structured["lines"])
    assert longest < 5000, f"a log line of {longest} characters"
    figures.record("bad_arguments", forged_log_lines=0, longest_log_line_after_a_100k_id=longest)
