"""Issue 36 item 3: a turn undone in one step. The runner takes a checkpoint of the unit server at the start of
every turn (labelled with the session and turn); `unit-mcp agent sessions undo SESSION [TURN]` shows the dry run's
diffs, asks, and rolls the units back to it; a source a person edited after the turn is a conflict, left alone
unless --force."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from unit_mcp.agent import (
    AgentApprovals,
    AgentToolSurface,
    FunctionAgent,
    ModelRequest,
    ModelResponse,
    TurnContext,
    TurnStatus,
)
from unit_mcp.agent.items import EventItem
from unit_mcp.wire import RISKS

from .conftest import UnitServer, agent_cli, reload, running

pytestmark = pytest.mark.anyio

PATCHES = [
    ("greeter", "greeter.py", "Hello", "Howdy"),
    ("notes", "__init__.py", "café au lait", "café crème"),
]


def patching(request: ModelRequest, ctx: TurnContext) -> ModelResponse | str:
    """The turn's model: two patches, then an answer."""
    if request.messages[-1]["role"] != "user":
        return "patched"
    return ModelResponse.calling(
        *(("unit_apply_patch", {"unit_id": u, "source_id": s, "old": o, "new": n}) for u, s, o, n in PATCHES)
    )


async def a_turn_that_patches(unit_server: UnitServer, tmp_path: Path) -> tuple[str, str]:
    """One session with one turn that patched greeter and notes through the unit server; (session, turn)."""
    surface = AgentToolSurface(AgentApprovals(dict.fromkeys(RISKS, "auto")))
    async with (
        unit_server.source() as source,
        running(tmp_path, {"f": lambda deps: FunctionAgent(patching, id="f")}, surface=surface) as runner,
    ):
        surface.add_source(source)
        session = await runner.create_session("f")
        handle = await runner.run_turn(session.id, "patch them")
        assert (await handle.wait(30)).status is TurnStatus.COMPLETED
        return session.id, handle.id


async def undo(tmp_path: Path, unit_server: UnitServer, *args: str) -> tuple[int, str, str]:
    command = [
        "--data-dir",
        str(tmp_path / "agent-data"),
        "--sessions",
        str(tmp_path / "sessions"),
        "sessions",
        "undo",
        *args,
        "--mcp-url",
        unit_server.url,
        "--mcp-token-file",
        unit_server.token_file(tmp_path),
    ]
    return await agent_cli(*command, env={**os.environ, "MCP_URL": ""})


def source(unit_server: UnitServer, unit_id: str, source_id: str) -> str:
    folder = unit_server.units_root
    return (folder / unit_id / source_id if (folder / unit_id).is_dir() else folder / source_id).read_text()


async def test_each_turn_starts_with_a_checkpoint_labelled_with_its_session_and_turn(
    unit_server: UnitServer, tmp_path: Path
) -> None:
    session_id, turn_id = await a_turn_that_patches(unit_server, tmp_path)
    events = [i for i in reload(tmp_path, session_id).items if isinstance(i, EventItem) and i.kind == "unit-checkpoint"]
    assert len(events) == 1 and events[0].turn_id == turn_id
    assert events[0].data["label"] == f"session {session_id} turn {turn_id}"
    assert [c.name for c in unit_server.calls] == ["unit_checkpoint", "unit_apply_patch", "unit_apply_patch"]
    assert unit_server.checkpoints() == unit_server.calls[:1]  # before any tool the model called


async def test_the_cli_undoes_a_turn_and_leaves_a_persons_later_edit_unless_force(
    unit_server: UnitServer, tmp_path: Path
) -> None:
    greeter, notes = source(unit_server, "greeter", "greeter.py"), source(unit_server, "notes", "__init__.py")
    session_id, turn_id = await a_turn_that_patches(unit_server, tmp_path)
    assert "Howdy" in source(unit_server, "greeter", "greeter.py")
    # a person edits notes after the turn
    edited = source(unit_server, "notes", "__init__.py").replace("café crème", "café noir")
    (unit_server.units_root / "notes" / "__init__.py").write_text(edited)

    code, out, err = await undo(tmp_path, unit_server, session_id)  # no terminal, no --yes: shown, not undone
    assert code == 1 and "give --yes" in err and "Howdy" in out  # the diff, then the refusal to go on unasked
    assert "Howdy" in source(unit_server, "greeter", "greeter.py")

    code, out, err = await undo(tmp_path, unit_server, session_id, turn_id, "--yes")
    assert code == 1, err
    assert "+" in out and "Howdy" in out and "Hello" in out  # the dry run's diff of greeter was shown first
    assert "conflict: notes/__init__.py" in err and "left alone" in err and "--force" in err
    assert source(unit_server, "greeter", "greeter.py") == greeter  # the turn's patch undone
    assert source(unit_server, "notes", "__init__.py") == edited  # the person's edit stays

    code, out, err = await undo(tmp_path, unit_server, session_id, turn_id, "--yes", "--force")
    assert code == 0, err
    assert source(unit_server, "notes", "__init__.py") == notes
    undone = [i for i in reload(tmp_path, session_id).items if isinstance(i, EventItem) and i.kind == "turn-undone"]
    assert [(e.data["turn_id"], e.data["restored"], e.data["conflicts"], e.data["force"]) for e in undone] == [
        (turn_id, ["greeter/greeter.py"], ["notes/__init__.py"], False),
        (turn_id, ["notes/__init__.py"], [], True),
    ]


async def test_an_unknown_turn_is_refused_in_one_line(unit_server: UnitServer, tmp_path: Path) -> None:
    session_id, _ = await a_turn_that_patches(unit_server, tmp_path)
    code, _, err = await undo(tmp_path, unit_server, session_id, "turn-000000000000", "--yes")
    assert code == 1 and "has no checkpoint of turn turn-000000000000" in err
    assert "Howdy" in source(unit_server, "greeter", "greeter.py")
