"""Capability presets over the real unit server: offering, risk, approval to activate, session items,
resync of the approval-filtered endpoint over real HTTP, prompts, and preset files."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from unit_mcp.agent import (
    AgentApprovals,
    AgentToolSurface,
    ApprovedEndpoint,
    FunctionAgent,
    ModelRequest,
    ModelResponse,
    PendingApprovals,
    TurnContext,
    TurnStatus,
)
from unit_mcp.agent.items import EventItem, ToolResultItem
from unit_mcp.agent.opencode import OpenCodeView
from unit_mcp.agent.presets import Preset, PresetError, PresetManager, load_presets
from unit_mcp.agent.prompts import format_presets

from .conftest import UnitServer, endpoint_client, reload, running

pytestmark = pytest.mark.anyio
CONTROL = ["preset_activate", "preset_deactivate"]


def declared(**active: bool) -> list[Preset]:
    return [
        Preset(
            name="look",
            description="Look at units.",
            tools=["unit_list", "unit_inspect"],
            active=active.get("look", True),
        ),
        Preset(
            name="edit",
            description="Read and change unit sources.",
            tools=["unit_read_*", "unit_apply_patch"],
            prompt="Pass the hash you read as expected_hash.",
            active=active.get("edit", False),
        ),
        Preset(name="shell", description="Tests and reloads.", tools=["unit_run_tests", "unit_reload", "no_such_tool"]),
    ]


@asynccontextmanager
async def surface_on(
    unit_server: UnitServer, approvals: AgentApprovals | None = None, **active: bool
) -> AsyncIterator[AgentToolSurface]:
    surface = AgentToolSurface(approvals or AgentApprovals(), presets=PresetManager(declared(**active)))
    async with unit_server.source() as source:
        surface.add_source(source)
        yield surface


def offered(surface: AgentToolSurface) -> list[str]:
    return sorted(tool.name for tool in surface.tools())


async def test_only_the_active_presets_tools_are_offered_and_risk_is_the_highest(unit_server: UnitServer) -> None:
    async with surface_on(unit_server) as surface:
        assert offered(surface) == sorted([*CONTROL, "unit_inspect", "unit_list"])
        infos = {info.name: info for info in surface.preset_infos()}
        assert (infos["look"].risk, infos["look"].active) == ("normal", True)
        assert infos["edit"].risk == "shell"  # unit_apply_patch reloads, running the new code
        assert sorted(infos["edit"].tools) == ["unit_apply_patch", "unit_read_log", "unit_read_source"]
        assert (infos["shell"].risk, infos["shell"].missing) == ("shell", ["no_such_tool"])
        assert [info.name for info in surface.preset_infos(active_only=True)] == ["look"]

        refused = await surface.call("unit_read_source", {"unit_id": "greeter", "source_id": "greeter.py"})
        assert refused.is_error and refused.text.startswith("[preset_inactive] unit_read_source belongs to preset edit")
        assert unit_server.called() == []
        unknown = await surface.call("nope", {})
        assert unknown.is_error and unknown.text.startswith("[unknown_tool]")

        surface.presets.activate("shell")  # the application's own decision: no approval
        assert {"unit_run_tests", "unit_reload"} <= set(offered(surface))
        assert "no_such_tool" not in offered(surface)


def activating(*names: str, then: str = "done"):  # type: ignore[no-untyped-def]
    requests: list[ModelRequest] = []

    def model(request: ModelRequest, ctx: TurnContext) -> ModelResponse | str:
        requests.append(request)
        if request.step <= len(names):
            return ModelResponse.calling(("preset_activate", {"name": names[request.step - 1]}))
        return then

    model.requests = requests  # type: ignore[attr-defined]
    return model


def offered_in(request: ModelRequest) -> set[str]:
    return {tool["function"]["name"] for tool in request.tools}


async def test_activating_a_risky_preset_is_an_approval_request_answered_through_the_runner(
    unit_server: UnitServer, tmp_path: Path
) -> None:
    pending = PendingApprovals()
    model = activating("edit")
    async with surface_on(unit_server, AgentApprovals(approver=pending)) as surface:
        changes = anyio.Event()
        surface.on_change(changes.set)
        async with running(tmp_path, {"f": lambda deps: FunctionAgent(model, id="f")}, surface=surface) as runner:
            session = await runner.create_session("f")
            handle = await runner.run_turn(session.id, "fix greeter")
            with anyio.fail_after(5):
                while not await runner.pending_approvals(session.id):
                    await anyio.sleep(0.01)
            (request,) = await runner.pending_approvals(session.id)
            assert (request.tool, request.risk, request.arguments) == (
                "preset_activate",
                "shell",
                {"name": "edit"},
            )
            assert not surface.presets.is_active("edit") and not changes.is_set()
            await runner.answer_approval(session.id, request.id, approved=True)
            assert (await handle.wait(5)).status is TurnStatus.COMPLETED
        assert changes.is_set() and surface.presets.is_active("edit")

    assert "unit_read_source" not in offered_in(model.requests[0])
    assert "unit_read_source" in offered_in(model.requests[1])  # offered from the next step on
    items = reload(tmp_path, session.id).items
    (activated,) = [i for i in items if isinstance(i, EventItem) and i.kind == "preset-activated"]
    assert activated.data["name"] == "edit" and activated.data["risk"] == "shell"
    kinds = [i.kind for i in items if isinstance(i, EventItem)]
    assert kinds.index("approval-requested") < kinds.index("approval-decided") < kinds.index("preset-activated")


async def test_a_denied_activation_changes_nothing_and_deactivation_never_asks(
    unit_server: UnitServer, tmp_path: Path
) -> None:
    asked: list[str] = []

    def deny(request: Any) -> bool:
        asked.append(request.tool)
        return False

    def model(request: ModelRequest, ctx: TurnContext) -> ModelResponse | str:
        if request.step == 1:
            return ModelResponse.calling(("preset_activate", {"name": "shell"}))
        if request.step == 2:
            return ModelResponse.calling(("preset_deactivate", {"name": "edit"}), ("preset_activate", {"name": "look"}))
        return "ok"

    async with surface_on(unit_server, AgentApprovals(approver=deny), edit=True) as surface:
        async with running(tmp_path, {"f": lambda deps: FunctionAgent(model, id="f")}, surface=surface) as runner:
            session = await runner.create_session("f")
            assert (await (await runner.run_turn(session.id, "go")).wait(5)).status is TurnStatus.COMPLETED
        assert asked == ["preset_activate"]  # only the shell preset asked; deactivating and `normal` never do
        assert surface.presets.active() == ["look"]
    items = reload(tmp_path, session.id).items
    results = {i.call_id: i for i in items if isinstance(i, ToolResultItem)}
    outputs = [r.output for r in results.values()]
    assert any(o.startswith("[approval_denied] preset_activate (risk: shell)") for o in outputs)
    assert any(o.startswith("preset look is active (it already was)") for o in outputs)
    events = [(i.kind, i.data["name"]) for i in items if isinstance(i, EventItem) and i.kind.startswith("preset-")]
    assert sorted(events) == [("preset-activated", "look"), ("preset-deactivated", "edit")]


async def test_preset_changes_resync_the_approved_endpoint_over_http(unit_server: UnitServer, tmp_path: Path) -> None:
    notified = anyio.Event()

    async with (
        surface_on(unit_server, AgentApprovals({"filesystem-read": "auto"})) as surface,
        ApprovedEndpoint(surface, config_root=tmp_path / "oc") as endpoint,
        endpoint_client(endpoint, "legacy", tools_changed=notified) as legacy,
    ):
        listed = sorted(t.name for t in (await legacy.list_tools(cache_mode="refresh")).tools)
        assert listed == sorted([*CONTROL, "unit_inspect", "unit_list"])
        surface.presets.activate("edit")
        with anyio.fail_after(5):
            await notified.wait()
        listed = sorted(t.name for t in (await legacy.list_tools(cache_mode="refresh")).tools)
        # edit's readers are approved by the policy; its writer only for dry runs (filesystem-read), not writes
        assert listed == sorted(
            [*CONTROL, "unit_apply_patch", "unit_inspect", "unit_list", "unit_read_log", "unit_read_source"]
        )
        patch = {"unit_id": "greeter", "source_id": "greeter.py", "old": "Hello", "new": "Hi"}
        written = await legacy.call_tool("unit_apply_patch", patch)
        assert written.is_error and "[approval_denied] unit_apply_patch (risk: shell)" in str(written.content)
        previewed = await legacy.call_tool("unit_apply_patch", {**patch, "dry_run": True})
        assert not previewed.is_error and previewed.structured_content["dry_run"] is True  # type: ignore[index]
        over_http = await legacy.call_tool("preset_activate", {"name": "shell"})
        assert over_http.is_error  # no one can approve a shell preset for this endpoint
        assert not surface.presets.is_active("shell")


async def test_prompts_and_the_turn_context_show_the_presets(unit_server: UnitServer, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def model(request: ModelRequest, ctx: TurnContext) -> str:
        seen["system"] = request.messages[0]["content"]
        seen["presets"] = [p.name for p in ctx.presets]
        return "ok"

    async with surface_on(unit_server, edit=True) as surface:
        text = format_presets(surface.preset_infos())
        assert "- look (normal; active): Look at units.\n  tools: unit_list, unit_inspect" in text
        assert "- shell (shell; inactive, activate with preset_activate (the user approves it)): Tests" in text
        agents = {"f": lambda deps: FunctionAgent(model, id="f", instructions="Be careful.")}
        async with running(tmp_path, agents, surface=surface) as runner:
            session = await runner.create_session("f")
            await (await runner.run_turn(session.id, "hi")).wait(5)
    assert seen["presets"] == ["look", "edit"]
    assert "## Capability presets\n- look (normal; active)" in seen["system"]
    assert "Pass the hash you read as expected_hash." in seen["system"]


def test_preset_files_in_toml_and_json(tmp_path: Path) -> None:
    toml = tmp_path / "presets.toml"
    toml.write_text(
        '[[preset]]\nname = "look"\ntools = ["unit_list"]\nactive = true\n\n'
        '[[preset]]\nname = "shell"\ndescription = "tests"\ntools = ["unit_run_*"]\n'
    )
    as_json = tmp_path / "presets.json"
    as_json.write_text(json.dumps({"presets": [p.model_dump() for p in load_presets(toml)]}))
    assert load_presets(toml) == load_presets(as_json)
    assert [p.name for p in load_presets(toml)] == ["look", "shell"]

    bad = tmp_path / "bad.toml"
    for text, expected in [
        ('[[preset]]\nname = "x"\n', "preset #1 is invalid: tools: Field required"),
        ('[[preset]]\nname = "a b"\ntools = ["t"]\n', "preset #1 is invalid: name"),
        ('[[preset]]\nname = "x"\ntools = ["t"]\n[[preset]]\nname = "x"\ntools = ["u"]\n', "declared twice: x"),
        ('[[preset]\nname = "x"', "is not valid TOML"),
        ("[tools]\nx = 1\n", "unknown top-level key(s) tools"),
    ]:
        bad.write_text(text)
        with pytest.raises(PresetError, match=expected.replace("(", r"\(").replace(")", r"\)")):
            load_presets(bad)
    with pytest.raises(PresetError, match="cannot read the preset file"):
        load_presets(tmp_path / "missing.toml")


def test_the_active_set_survives_the_process_with_a_state_file(tmp_path: Path) -> None:
    state = tmp_path / "state" / "active.json"
    first = PresetManager(declared(), state_path=state)
    assert first.active() == ["look"]
    assert first.activate("shell") and first.deactivate("look")
    assert not first.activate("shell")
    assert PresetManager(declared(), state_path=state).active() == ["shell"]
    with pytest.raises(PresetError, match="no preset named 'nope'"):
        first.activate("nope")
    state.write_text("{not json")
    with pytest.raises(PresetError, match="cannot be read"):
        PresetManager(declared(), state_path=state)


async def test_the_user_sets_a_preset_through_the_runner_without_approval(
    unit_server: UnitServer, tmp_path: Path
) -> None:
    asked: list[object] = []
    async with (
        surface_on(unit_server, AgentApprovals(approver=asked.append)) as surface,
        running(tmp_path, {"f": lambda deps: FunctionAgent(lambda r, c: "ok", id="f")}, surface=surface) as runner,
    ):
        session = await runner.create_session("f")
        assert await runner.set_preset(session.id, "shell", active=True)
        assert not await runner.set_preset(session.id, "shell", active=True)
        assert await runner.set_preset(session.id, "look", active=False)
        with pytest.raises(PresetError, match="no preset named 'nope'"):
            await runner.set_preset(session.id, "nope", active=True)
    assert asked == [] and surface.presets.active() == ["shell"]
    items = reload(tmp_path, session.id).items
    recorded = [(i.kind, i.data["name"], i.data["changed"]) for i in items if isinstance(i, EventItem)]
    assert recorded == [
        ("preset-activated", "shell", True),
        ("preset-activated", "shell", False),
        ("preset-deactivated", "look", True),
    ]
    assert items[0].data["risk"] == "shell" and items[0].data["by"] == "user"  # type: ignore[union-attr]


async def test_presets_follow_the_application_context(unit_server: UnitServer, tmp_path: Path) -> None:
    """A context change offers and withdraws the presets declared for contexts, resyncs the endpoint over HTTP
    and is recorded in the session whose turn runs; a new turn records the context it starts in."""
    presets = [
        Preset(name="look", tools=["unit_list"], active=True),
        Preset(name="read", tools=["unit_read_*"], active=True, contexts=["editor"]),
        Preset(name="edit", tools=["unit_apply_patch"], contexts=["editor"]),
    ]
    surface = AgentToolSurface(AgentApprovals({"filesystem-read": "auto"}), presets=PresetManager(presets))
    steps: list[set[str]] = []
    context_set = anyio.Event()

    async def model(request: ModelRequest, ctx: TurnContext) -> ModelResponse | str:
        steps.append(offered_in(request))
        if request.step == 1:
            await context_set.wait()
            return ModelResponse.calling(("unit_list", {}))
        return "done"

    notified = anyio.Event()

    async with (
        unit_server.source() as source,
        ApprovedEndpoint(surface, config_root=tmp_path / "oc") as endpoint,
        running(tmp_path, {"f": lambda deps: FunctionAgent(model, id="f")}, surface=surface) as runner,
    ):
        surface.add_source(source)
        async with endpoint_client(endpoint, "legacy", tools_changed=notified) as legacy:
            listed = sorted(t.name for t in (await legacy.list_tools(cache_mode="refresh")).tools)
            assert listed == sorted([*CONTROL, "unit_list"])
            idle = await runner.create_session("f", title="idle")
            busy = await runner.create_session("f", title="busy")
            handle = await runner.run_turn(busy.id, "look around")
            with anyio.fail_after(5):
                while not steps:
                    await anyio.sleep(0.01)
            assert await runner.set_context("editor") == [busy.id]
            assert await runner.set_context("editor") == []  # no change, nothing recorded
            context_set.set()
            assert (await handle.wait(5)).status is TurnStatus.COMPLETED
            with anyio.fail_after(5):
                await notified.wait()
            listed = sorted(t.name for t in (await legacy.list_tools(cache_mode="refresh")).tools)
            assert listed == sorted([*CONTROL, "unit_list", "unit_read_log", "unit_read_source"])
            info = {i.name: i for i in surface.preset_infos()}
            assert info["read"].active and not info["edit"].active  # context narrows; it never activates
            await (await runner.run_turn(idle.id, "hi")).wait(5)
            assert await runner.set_context(None) == []
            assert "unit_read_source" not in {t.name for t in surface.tools()}
            out = surface.preset_infos()[1]
            assert out.out_of_context and "offered only in context editor" in format_presets([out])

    assert "unit_read_source" not in steps[0] and "unit_read_source" in steps[1]  # offered from the next step
    busy_items = [i for i in reload(tmp_path, busy.id).items if isinstance(i, EventItem)]
    changed = [i.data for i in busy_items if i.kind == "context-changed"]
    assert changed == [{"context": "editor", "previous": None, "offered": ["read"], "withdrawn": []}]
    idle_items = [i for i in reload(tmp_path, idle.id).items if isinstance(i, EventItem)]
    assert not [i for i in idle_items if i.kind == "context-changed"]
    assert [i.data.get("context") for i in idle_items if i.kind == "turn-started"] == ["editor"]


async def test_opencodes_preset_call_never_activates_a_risky_preset_by_itself(unit_server: UnitServer) -> None:
    """OpenCode's own call of preset_activate (say its rules were loosened and it did not ask) activates nothing
    above what the policy allows; a preset the turn activated after asking is only reported."""
    async with surface_on(unit_server, AgentApprovals(approver=lambda request: True)) as surface:
        view = OpenCodeView(surface, "unit-agent", [])
        rules = {rule["permission"] for rule in view.permission_rules()}
        assert {"unit-agent_preset_activate", "unit-agent_unit_read_source", "unit-agent_unit_reload"} <= rules
        refused = await view.run("preset_activate", {"name": "shell"})
        assert refused.is_error and "[approval_denied]" in refused.text and not surface.presets.is_active("shell")
        surface.presets.activate("shell")
        reported = await view.run("preset_activate", {"name": "shell"})
        assert not reported.is_error and reported.text.startswith("preset shell is active; its tools: ")
