"""The tool surface in memory: the SDK's `Client` talks to the low-level server in-process (both protocol
eras), over a real host on a copy of the example units. Fast; the HTTP transports are in test_http.py."""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import mcp_types as types
import pytest
from conftest import LOADERS, store_of
from mcp import Client
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

from unit_mcp import Host, UnitService
from unit_mcp.arguments import ApplyPatchArgs
from unit_mcp.models import ReadSourceResult, UnitListResult
from unit_mcp.tooldecl import PlainSchema
from unit_mcp.tools import HISTORY_TOOLS, TOOLS, UnitTools, tool_risks
from unit_mcp.wire import DRY_RUN_RISK_META_KEY, ERROR_META_KEY, RISK_META_KEY

pytestmark = pytest.mark.anyio

NAMES = [
    "unit_list",
    "unit_resolve",
    "unit_inspect",
    "unit_read_source",
    "unit_apply_patch",
    "unit_create_source",
    "unit_run_tests",
    "unit_test_status",
    "unit_cancel_test",
    "unit_reload",
    "unit_read_log",
    "unit_snapshot",
    "unit_restore_snapshot",
    "unit_changes",
    "unit_checkpoint",
    "unit_rollback",
    "unit_revert_change",
]
RISKS = {
    "unit_list": "normal",
    "unit_resolve": "normal",
    "unit_inspect": "normal",
    "unit_snapshot": "normal",
    "unit_test_status": "normal",
    "unit_cancel_test": "shell",
    "unit_read_source": "filesystem-read",
    "unit_read_log": "filesystem-read",
    "unit_apply_patch": "shell",
    "unit_create_source": "shell",
    "unit_run_tests": "shell",
    "unit_reload": "shell",
    "unit_changes": "filesystem-read",
    "unit_checkpoint": "normal",
    "unit_rollback": "destructive",
    "unit_revert_change": "shell",
    "unit_restore_snapshot": "shell",
}
DRY_RUNS = {"unit_apply_patch", "unit_rollback", "unit_revert_change"}


@pytest.fixture(params=LOADERS)
def host(request: pytest.FixtureRequest, units_root: Path, tmp_path: Path) -> Iterator[Host]:
    """Every tool test that is not about files runs on every loader (test_loaders.py has the contract)."""
    with Host(store_of(request, units_root, tmp_path), tmp_path / "data") as started:
        yield started


@pytest.fixture
def tools(service: UnitService) -> UnitTools:
    return UnitTools(service, progress_interval=0.1)


@pytest.fixture
def folder_tools(units_root: Path, tmp_path: Path) -> Iterator[UnitTools]:
    """For tests about the folder loader's files (and the exact tools of a loader without history)."""
    with Host(units_root, tmp_path / "data") as started:
        yield UnitTools(UnitService(started, test_timeout=30), progress_interval=0.1)


@asynccontextmanager
async def connect(tools: UnitTools, mode: str = "auto") -> AsyncIterator[Client]:
    async with Client(tools.server(), mode=mode) as client:
        yield client


class Session:
    """A connected client plus the advertised output schemas, so every result is checked against them."""

    def __init__(self, client: Client, listed: list[types.Tool]) -> None:
        self.client = client
        self.schemas = {tool.name: tool.output_schema for tool in listed}

    async def ok(self, name: str, arguments: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        result = await self.client.call_tool(name, arguments or {}, **kwargs)
        assert not result.is_error, result.content
        jsonschema.validate(result.structured_content, self.schemas[name])
        text = result.content[0]
        assert isinstance(text, types.TextContent)
        assert json.loads(text.text) == result.structured_content
        assert not at_default(result.structured_content, self.schemas[name]), "a field at its default is left out"
        return dict(result.structured_content)

    async def refused(self, name: str, arguments: dict[str, Any], code: str) -> str:
        result = await self.client.call_tool(name, arguments)
        assert result.is_error
        assert result.structured_content is None
        text = result.content[0]
        assert isinstance(text, types.TextContent)
        assert text.text.startswith(f"[{code}] "), text.text
        assert result.meta is not None and result.meta[ERROR_META_KEY]["code"] == code
        return text.text


@asynccontextmanager
async def session(tools: UnitTools, mode: str = "auto") -> AsyncIterator[Session]:
    async with connect(tools, mode) as client:
        listed = await client.list_tools()
        yield Session(client, listed.tools)


def at_default(value: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    """The fields of a result (and of the objects in it) sent with the value their schema names as the default."""
    found: list[str] = []
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for key, item in value.items():
            field = properties.get(key, {})
            if "default" in field and item == field["default"]:
                found.append(f"{where}{key}")
            found += at_default(item, field, f"{where}{key}.")
    elif isinstance(value, list):
        for n, item in enumerate(value):
            found += at_default(item, schema.get("items", {}), f"{where}{n}.")
    return found


def sha(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


# -- the advertised surface ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_lists_every_tool_with_schemas_annotations_and_risks(folder_tools: UnitTools, mode: str) -> None:
    tools = folder_tools
    async with connect(tools, mode) as client:
        listed = (await client.list_tools()).tools
    assert [tool.name for tool in listed] == NAMES
    for tool in listed:
        assert tool.description and len(tool.description) > 80
        dry_run = {DRY_RUN_RISK_META_KEY: "filesystem-read"} if tool.name in DRY_RUNS else {}
        assert tool.meta == {RISK_META_KEY: RISKS[tool.name], **dry_run}
        annotations = tool.annotations
        assert annotations is not None and annotations.open_world_hint is False
        # a checkpoint writes no source, but a record: not read-only, and not idempotent
        low = RISKS[tool.name] in ("normal", "filesystem-read") and tool.name != "unit_checkpoint"
        assert annotations.read_only_hint == low
        if annotations.read_only_hint:
            assert annotations.destructive_hint is False and annotations.idempotent_hint is True
        schema = tool.input_schema
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        assert "$defs" not in schema and "$ref" not in json.dumps(schema), "input schemas are flat"
        assert "anyOf" not in json.dumps(schema), "optional arguments are plain types"
        assert tool.output_schema is not None and tool.output_schema["type"] == "object"
    by_name = {tool.name: tool for tool in listed}
    assert by_name["unit_apply_patch"].annotations.destructive_hint is True  # type: ignore[union-attr]
    assert by_name["unit_create_source"].annotations.destructive_hint is False  # type: ignore[union-attr]
    assert set(by_name["unit_apply_patch"].input_schema["properties"]) == {
        "unit_id",
        "source_id",
        "patch",
        "old",
        "new",
        "expected_hash",
        "replace_all",
        "dry_run",
        "test",
    }
    plain = UnitListResult.model_json_schema(mode="serialization", schema_generator=PlainSchema)
    assert by_name["unit_list"].output_schema == plain, "listed as the one generator writes it"
    assert tool_risks() == RISKS


async def test_instructions_describe_the_workflow_and_nothing_else_is_served(tools: UnitTools) -> None:
    async with connect(tools, "legacy") as client:
        instructions = client.instructions or ""
        assert (await client.list_resources()).resources == []
        assert (await client.list_prompts()).prompts == []
    steps = ["unit_list", "unit_resolve", "unit_inspect", "unit_read_source", "expected_hash", "unit_run_tests"]
    positions = [instructions.index(step) for step in [*steps, "unit_reload", "unit_read_log"]]
    assert positions == sorted(positions)
    assert "leaves out each field at its default" in instructions  # the model reads results without the schema


async def test_prefix_renames_tools_and_their_cross_references(folder_tools: UnitTools) -> None:
    service = folder_tools.service
    prefixed = UnitTools(service, prefix="space_")
    async with connect(prefixed) as client:
        listed = (await client.list_tools()).tools
        assert "space_unit_read_source" in (client.instructions or "")
        refusal = await client.call_tool("space_unit_inspect", {"unit_id": "nope"})
    assert [tool.name for tool in listed] == ["space_" + name for name in NAMES]
    patch = next(tool for tool in listed if tool.name == "space_unit_apply_patch")
    assert "space_unit_read_source" in (patch.description or "")
    assert "space_space_" not in json.dumps([tool.model_dump(mode="json") for tool in listed])
    text = refusal.content[0]
    assert isinstance(text, types.TextContent) and "Call space_unit_list" in text.text
    assert tool_risks("space_") == {"space_" + name: risk for name, risk in RISKS.items()}
    with pytest.raises(ValueError, match="prefix"):
        UnitTools(service, prefix="bad prefix!")


def test_every_tool_calls_the_service_method_named_like_it() -> None:
    """One method per tool, named like it, taking the tool's arguments and returning its result model."""
    for spec in (*TOOLS, *HISTORY_TOOLS):
        assert spec.handler.__name__ == spec.name.removeprefix("unit_")
        assert list(inspect.signature(spec.handler).parameters) == ["self", *spec.args.model_fields], spec.name
        assert issubclass(spec.result, BaseModel) and spec.result.__name__.endswith("Result"), spec.name


# -- happy paths -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_read_only_tools(tools: UnitTools, mode: str) -> None:
    async with session(tools, mode) as s:
        listing = await s.ok("unit_list")
        ids = [unit["unit_id"] for unit in listing["units"]]
        assert ids == sorted(ids) and {"counter", "greeter", "weather", "notes"} <= set(ids)
        resolved = await s.ok("unit_resolve", {"description": "click counter", "limit": 3})
        assert resolved["candidates"][0]["unit_id"] == "counter" and len(resolved["candidates"]) <= 3
        inspected = await s.ok("unit_inspect", {"unit_id": "counter"})
        assert inspected["lifecycle"] == {"init": "init", "drop": "drop", "snapshot": "snapshot", "restore": "restore"}
        assert {a["source_id"] for a in inspected["source_artifacts"]} >= {"__init__.py", "panel.py", "test_init.py"}
        read = await s.ok("unit_read_source", {"unit_id": "greeter", "source_id": "greeter.py"})
        ReadSourceResult.model_validate(read)
        assert "def greet" in read["content"] and read["hash"].startswith("sha256:")
        snap = await s.ok("unit_snapshot", {"unit_id": "counter"})
        assert snap.pop("snapshot_id").startswith("snap-")
        assert snap == {"unit_id": "counter", "supported": True, "state": {"count": 0}}  # truncated: false, left out
        log = await s.ok("unit_read_log", {"grep": "counter ready", "lines": 5})
        assert log["returned"] >= 1 and all("counter ready" in line for line in log["lines"])


async def test_a_snapshot_is_restored_through_the_tools(tools: UnitTools, host: Host) -> None:
    async with session(tools) as s:
        host.module("counter").count = 5
        snap = await s.ok("unit_snapshot", {"unit_id": "counter"})
        assert snap["state"] == {"count": 5}
        host.module("counter").increment()
        restored = await s.ok("unit_restore_snapshot", {"unit_id": "counter", "snapshot_id": snap["snapshot_id"]})
        assert restored == {"unit_id": "counter", "snapshot_id": snap["snapshot_id"], "restored": True}
        assert host.module("counter").count == 5
        assert (await s.ok("unit_snapshot", {"unit_id": "counter"}))["state"] == {"count": 5}
        text = await s.refused(
            "unit_restore_snapshot", {"unit_id": "counter", "snapshot_id": "snap-00"}, "invalid_argument"
        )
        assert "snapshot_id" in text
        await s.refused(
            "unit_restore_snapshot", {"unit_id": "greeter", "snapshot_id": snap["snapshot_id"]}, "unknown_snapshot"
        )


async def test_edit_workflow_with_expected_hash_diff_and_dry_run(folder_tools: UnitTools, units_root: Path) -> None:
    tools = folder_tools
    source = units_root / "counter" / "__init__.py"
    async with session(tools) as s:
        read = await s.ok("unit_read_source", {"unit_id": "counter", "source_id": "__init__.py"})
        dry = await s.ok(
            "unit_apply_patch",
            {
                "unit_id": "counter",
                "source_id": "__init__.py",
                "old": "step = 1",
                "new": "step = 2",
                "expected_hash": read["hash"],
                "dry_run": True,
            },
        )
        assert dry["dry_run"] and dry["changed"] and "reload" not in dry and sha(source) == read["hash"]
        edited = await s.ok(
            "unit_apply_patch",
            {
                "unit_id": "counter",
                "source_id": "__init__.py",
                "old": "step = 1",
                "new": "step = 2",
                "expected_hash": read["hash"],
            },
        )
        assert edited["hash"] == sha(source) != read["hash"]
        assert edited["reload"]["reloaded"] is True and "+step = 2" in edited["diff"]
        line = source.read_text().splitlines().index("step = 2") + 1
        diff = f"--- a/__init__.py\n+++ b/__init__.py\n@@ -{line},1 +{line},1 @@\n-step = 2\n+step = 3\n"
        patched = await s.ok(
            "unit_apply_patch",
            {
                "unit_id": "counter",
                "source_id": "__init__.py",
                "patch": diff,
                "expected_hash": edited["hash"],
            },
        )
        assert patched["mode"] == "diff" and "step = 3" in source.read_text()
        created = await s.ok(
            "unit_create_source",
            {"unit_id": "counter", "source_id": "util/helpers.py", "source": "def twice(x):\n    return 2 * x\n"},
        )
        assert created["reload"]["reloaded"] and (units_root / "counter" / "util" / "helpers.py").is_file()


async def test_a_text_dry_run_answered_at_once_is_the_worker_threads_answer(
    folder_tools: UnitTools, units_root: Path
) -> None:
    """A dry run of an exact replacement in a small non-Python source is answered on the event loop
    (`apply_patch_at_once`): the same answer as the dry run the worker thread makes, nothing written, the same
    refusals; a replacement it does not find as sent is left to the worker thread's tolerant matchers."""
    notes = units_root / "counter" / "notes.txt"
    notes.write_text("first line\nsecond line   \nthird line\n")
    before = sha(notes)
    service = folder_tools.service
    exact = {"unit_id": "counter", "source_id": "notes.txt", "old": "second", "new": "2nd", "dry_run": True}
    quick = service.apply_patch_at_once(ApplyPatchArgs.model_validate(exact))
    assert quick is not None and quick == service.apply_patch(**exact)
    loose = dict(exact, old="second line\n", new="2nd line\n")  # trailing spaces: a tolerant match
    assert service.apply_patch_at_once(ApplyPatchArgs.model_validate(loose)) is None
    async with session(folder_tools) as s:
        dry = await s.ok("unit_apply_patch", exact)
        assert dry == quick.model_dump(mode="json", exclude_defaults=True) and dry["hash_before"] == before
        assert dry["changed"] and "+2nd line" in dry["diff"] and not {"reload", "change_id"} & dry.keys()
        assert (await s.ok("unit_apply_patch", loose))["match"] == "trimmed"
        await s.refused("unit_apply_patch", dict(exact, expected_hash="sha256:" + "0" * 64), "stale_hash")
        await s.refused("unit_apply_patch", dict(exact, old="line"), "ambiguous_match")
    assert sha(notes) == before


async def test_run_tests_reports_progress_while_it_runs(tools: UnitTools) -> None:
    slow = "import time\n\n\ndef main():\n    time.sleep(0.6)\n"
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async with session(tools) as s:
        await s.ok("unit_create_source", {"unit_id": "counter", "source_id": "test_slow.py", "source": slow})
        run = await s.ok("unit_run_tests", {"unit_id": "counter", "test_name": "slow"}, progress_callback=on_progress)
        assert run["passed"] and run["exit_code"] == 0 and run["runner"] == "main" and not run["timed_out"]
        quick = await s.ok("unit_run_tests", {"unit_id": "counter"})
        assert quick["passed"] and quick["test_name"] == "init"
    assert len(progress) >= 3
    values = [value for value, _ in progress]
    assert values == sorted(values)
    assert all(message and "test_slow of unit counter" in message for _, message in progress)


async def test_reload_reports_activity_evidence(tools: UnitTools, host: Host) -> None:
    host.activate("counter")
    async with session(tools) as s:
        reloaded = await s.ok("unit_reload", {"unit_id": "counter"})
    assert reloaded["reloaded"] and reloaded["restored_state"]
    assert reloaded["activity"]["active_activity_before"] == "counter"
    assert reloaded["activity"]["active_activity_after"] == "counter"
    assert reloaded["activity"]["reactivation_attempted"] and reloaded["activity"]["has_active_session_after"]


# -- refusals --------------------------------------------------------------------------------------------


async def test_refusals_carry_code_hint_and_no_host_path(
    folder_tools: UnitTools, units_root: Path, tmp_path: Path
) -> None:
    tools = folder_tools
    (units_root / "counter" / "blob.bin").write_bytes(b"\x00\x01\x02")
    source = units_root / "counter" / "__init__.py"
    before = sha(source)
    cases: list[tuple[str, dict[str, Any], str, str]] = [
        ("unit_inspect", {"unit_id": "nope"}, "unknown_unit", "unit_list"),
        ("unit_inspect", {"unit_id": "../etc"}, "invalid_unit_id", ""),
        ("unit_read_source", {"unit_id": "counter", "source_id": "../../etc/passwd"}, "invalid_source_id", ""),
        ("unit_read_source", {"unit_id": "counter", "source_id": "missing.py"}, "unknown_source", ""),
        ("unit_read_source", {"unit_id": "counter", "source_id": "blob.bin"}, "binary_source", ""),
        (
            "unit_apply_patch",
            {
                "unit_id": "counter",
                "source_id": "__init__.py",
                "old": "x",
                "new": "y",
                "expected_hash": "sha256:" + "0" * 64,
            },
            "stale_hash",
            "unit_read_source",
        ),
        (
            "unit_apply_patch",
            {"unit_id": "counter", "source_id": "__init__.py", "old": "nowhere", "new": "y"},
            "no_match",
            "",
        ),
        (
            "unit_apply_patch",
            {"unit_id": "counter", "source_id": "__init__.py", "old": "count", "new": "n"},
            "ambiguous_match",
            "",
        ),
        (
            "unit_apply_patch",
            {"unit_id": "counter", "source_id": "__init__.py", "old": "step = 1", "new": "step = ("},
            "syntax_error",
            "",
        ),
        (
            "unit_apply_patch",
            {"unit_id": "counter", "source_id": "__init__.py", "old": "step = 1", "new": "step = 1 / 0"},
            "reload_failed",
            "",
        ),
        ("unit_create_source", {"unit_id": "counter", "source_id": "panel.py", "source": "x = 1\n"}, "exists", ""),
        (
            "unit_create_source",
            {"unit_id": "greeter", "source_id": "more.py", "source": "x = 1\n"},
            "not_supported",
            "",
        ),
        ("unit_run_tests", {"unit_id": "counter", "test_name": "nothere"}, "unknown_source", ""),
        ("unit_resolve", {"description": "  "}, "invalid_argument", ""),
        ("unit_read_log", {"lines": 0}, "invalid_argument", ""),
    ]
    async with session(tools) as s:
        for name, arguments, code, hint_mentions in cases:
            text = await s.refused(name, arguments, code)
            assert "\nHint: " in text or code == "invalid_argument", text
            assert hint_mentions in text
            assert str(tmp_path) not in text and str(units_root) not in text, text
        ambiguous = await s.client.call_tool(
            "unit_apply_patch", {"unit_id": "counter", "source_id": "__init__.py", "old": "count", "new": "n"}
        )
        assert ambiguous.meta is not None and ambiguous.meta[ERROR_META_KEY]["details"]["matches"] > 1
        assert sha(source) == before, "no refused edit wrote anything"
        still = await s.ok("unit_snapshot", {"unit_id": "counter"})
        assert still["supported"], "the previous version keeps serving after a failed reload"


async def test_test_timeout_is_refused_with_the_run_evidence(tools: UnitTools) -> None:
    async with session(tools) as s:
        result = await s.client.call_tool("unit_run_tests", {"unit_id": "looper", "timeout": 1})
    assert result.is_error and result.meta is not None
    error = result.meta[ERROR_META_KEY]
    assert error["code"] == "test_timeout" and error["details"]["timed_out"] is True


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"unit_id": "counter"}, "source_id: Field required"),
        ({"unit_id": "counter", "source_id": "__init__.py", "hash": "x"}, "hash: Extra inputs are not permitted"),
        ({"unit_id": 7, "source_id": "__init__.py"}, "unit_id: Input should be a valid string"),
    ],
)
async def test_bad_arguments_are_an_error_result(tools: UnitTools, arguments: dict[str, Any], problem: str) -> None:
    async with session(tools) as s:
        text = await s.refused("unit_read_source", arguments, "invalid_argument")
        assert problem in text
        await s.ok("unit_list")


async def test_unknown_tool_is_a_protocol_error(tools: UnitTools) -> None:
    async with connect(tools) as client:
        with pytest.raises(MCPError, match="Unknown tool: unit_delete"):
            await client.call_tool("unit_delete", {})
        assert not (await client.call_tool("unit_list", {})).is_error


async def test_unexpected_failure_is_a_generic_error_and_the_server_keeps_serving(
    folder_tools: UnitTools, units_root: Path
) -> None:
    moved = units_root.with_name("units-away")
    async with session(folder_tools) as s:
        units_root.rename(moved)
        try:
            text = await s.refused("unit_list", {}, "internal_error")
        finally:
            moved.rename(units_root)
        assert str(units_root) not in text and "unit_read_log" in text
        log = await s.ok("unit_read_log", {"grep": "unit_list failed unexpectedly"})
        assert log["returned"] >= 1
        assert all(str(units_root) not in line for line in log["lines"])
        await s.ok("unit_list")


async def test_concurrent_edits_with_the_same_expected_hash_cannot_both_win(tools: UnitTools) -> None:
    results: list[types.CallToolResult] = []
    async with session(tools) as s:
        read = await s.ok("unit_read_source", {"unit_id": "counter", "source_id": "__init__.py"})

        async def edit(value: int) -> None:
            arguments = {"unit_id": "counter", "source_id": "__init__.py", "old": "step = 1", "new": f"step = {value}"}
            results.append(await s.client.call_tool("unit_apply_patch", {**arguments, "expected_hash": read["hash"]}))

        async with anyio.create_task_group() as group:
            for value in (2, 3, 4):
                group.start_soon(edit, value)
    assert sorted(result.is_error for result in results) == [False, True, True]
    losers = [result.meta[ERROR_META_KEY]["code"] for result in results if result.is_error and result.meta]
    assert losers == ["stale_hash", "stale_hash"]


async def test_every_call_is_logged_with_its_outcome_but_without_contents(tools: UnitTools) -> None:
    async with connect(tools) as client:
        await client.call_tool("unit_read_source", {"unit_id": "counter", "source_id": "__init__.py"})
        await client.call_tool("unit_read_source", {"unit_id": "counter", "source_id": "nope.py"})
        secret = {"unit_id": "greeter", "source_id": "greeter.py", "old": "Hello", "new": "Top-secret-text"}
        await client.call_tool("unit_apply_patch", secret)
        log = (await client.call_tool("unit_read_log", {"grep": "call unit_"})).structured_content
    assert log is not None
    lines = log["lines"]
    assert any("call unit_read_source unit_id=counter source_id=__init__.py ok in" in line for line in lines)
    assert any(
        "call unit_read_source unit_id=counter source_id=nope.py refused: [unknown_source]" in line for line in lines
    )
    assert any("call unit_apply_patch unit_id=greeter source_id=greeter.py dry_run=False ok" in line for line in lines)
    assert not any("Top-secret-text" in line for line in lines)
