"""What the sessions list and a transcript show, for a real delegation: the child session is linked both ways,
tool calls carry their arguments and durations, a failed tool is marked."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import httpx
import pytest

from unit_mcp.agent import (
    AgentApprovals,
    AgentRegistry,
    AgentRunner,
    AgentToolSurface,
    FunctionAgent,
    ModelRequest,
    ModelResponse,
    ToolError,
    TurnContext,
    TurnStatus,
    delegation_tool,
)
from unit_mcp.agent.items import Session

from .conftest import page_client, serving

pytestmark = pytest.mark.anyio


def parent(request: ModelRequest, ctx: TurnContext) -> ModelResponse | str:
    if request.messages[-1]["role"] == "user":
        return ModelResponse.calling(("delegate_to_helper", {"task": "count the units"}), ("explode", {}))
    return "helper said: " + " | ".join(m["content"] for m in request.messages if m["role"] == "tool")


async def test_a_delegation_is_linked_both_ways_and_a_failed_tool_is_marked(tmp_path: Path) -> None:
    surface = AgentToolSurface(AgentApprovals())
    surface.add_local(delegation_tool("helper"))

    @surface.tool(risk="normal")
    def explode() -> str:
        raise ToolError("the <fuse> blew")

    registry = AgentRegistry()
    registry.register("parent", lambda deps: FunctionAgent(parent, id="parent"))
    registry.register("helper", lambda deps: FunctionAgent(lambda request, ctx: "4 units", id="helper"))
    async with (
        AgentRunner(store=tmp_path / "sessions", registry=registry, tools=surface) as runner,
        serving(runner) as (ui, base),
        page_client(ui.login_url(base)) as client,
    ):
        session = await runner.create_session("parent", title="count")
        await (await runner.run_turn(session.id, "how many units?")).wait(10)
        (child,) = [meta for meta in await runner.list_sessions() if meta.agent_id == "helper"]

        listing = (await client.get("/sessions")).text
        assert f'<a href="/sessions/{child.id}">{child.id}</a>' in listing  # both rows, the child's parent linked
        assert listing.count(f'<a href="/sessions/{session.id}">{session.id}</a>') == 2
        assert re.search(rf"{session.id}</a></td>\s*<td>parent</td>\s*<td><span class=\"badge badge-idle\">", listing)

        page = (await client.get(f"/sessions/{session.id}")).text
        assert f'child session: <a href="/sessions/{child.id}">{child.id}</a>' in page
        assert f'<a href="/sessions/{child.id}">{child.id}</a> (helper)' in page
        assert "→ delegate_to_helper" in page and "count the units" in page
        assert "✗ explode" in page and "the &lt;fuse&gt; blew" in page and "is-error" in page
        assert re.search(r"← delegate_to_helper</span>\s*<span class=\"duration\">\d+ ms</span>", page)
        assert "turn-completed" not in page and re.search(r"turn turn-\w+ completed", page)

        child_page = (await client.get(f"/sessions/{child.id}")).text
        assert f'<dt>parent</dt><dd><a href="/sessions/{session.id}">{session.id}</a></dd>' in child_page
        assert "4 units" in child_page

        assert (await client.get("/sessions/ses-nope")).status_code == 404
        assert (await client.get("/sessions/..%2F..%2Fetc")).status_code == 404


async def test_a_session_is_archived_or_deleted_from_the_list_but_not_while_its_turn_runs(tmp_path: Path) -> None:
    release = anyio.Event()

    async def slow(request: ModelRequest, ctx: TurnContext) -> str:
        await release.wait()
        return "done"

    registry = AgentRegistry()
    registry.register("slow", lambda deps: FunctionAgent(slow, id="slow"))
    async with (
        AgentRunner(store=tmp_path / "sessions", registry=registry, tools=AgentToolSurface(AgentApprovals())) as runner,
        serving(runner) as (ui, base),
        page_client(ui.login_url(base)) as client,
    ):
        busy, old, spent = [await runner.create_session("slow", title=title) for title in ("busy", "old", "spent")]
        turn = await runner.run_turn(busy.id, "take your time")
        listing = (await client.get("/sessions")).text
        assert listing.count('class="retire"') == 2 and f"/sessions/{busy.id}/retire" not in listing  # no button

        async def retire(session_id: str, action: str) -> str:
            answer = await client.post(
                f"/sessions/{session_id}/retire",
                data={"action": action},
                headers={"Origin": base},
                follow_redirects=True,
            )
            assert answer.status_code == 200, answer.text
            return answer.text

        assert f"Not deleted: session {busy.id} has a running turn." in await retire(busy.id, "delete")
        archived = await retire(old.id, "archive")
        assert f"Archived session {old.id} (old); the store&#39;s audit log records it." in archived
        assert f"Deleted session {spent.id} (spent)" in await retire(spent.id, "delete")
        async with httpx.AsyncClient(base_url=base) as stranger:  # no page session: refused before the route
            refused = await stranger.post(
                f"/sessions/{old.id}/retire", data={"action": "delete"}, headers={"Origin": base}
            )
        assert refused.status_code == 401
        assert [meta.id for meta in await runner.list_sessions()] == [busy.id]
        audit = [(r["action"], r["via"], r["session"]["id"]) for r in runner.store.audit()]
        assert audit == [("archive", "page", old.id), ("delete", "page", spent.id)]

        release.set()
        await turn.wait(10)
        assert f"Deleted session {busy.id} (busy)" in await retire(busy.id, "delete")  # idle now


class Interrupted:
    """An agent whose node dies mid-turn: it ends the turn interrupted."""

    id = name = "interrupted"

    async def run(self, input: str, session: Session, ctx: TurnContext) -> None:
        await ctx.turn.interrupted("the node died before it answered")


async def test_an_interrupted_turn_is_shown_interrupted_with_its_reason(tmp_path: Path) -> None:
    registry = AgentRegistry()
    registry.register("interrupted", lambda deps: Interrupted())
    async with (
        AgentRunner(store=tmp_path / "sessions", registry=registry, tools=AgentToolSurface(AgentApprovals())) as runner,
        serving(runner) as (ui, base),
        page_client(ui.login_url(base)) as client,
    ):
        session = await runner.create_session("interrupted")
        handle = await (await runner.run_turn(session.id, "go")).wait(10)
        page = (await client.get(f"/sessions/{session.id}")).text
    assert handle.status is TurnStatus.INTERRUPTED
    assert re.search(rf"turn {handle.id} interrupted", page) and "badge-interrupted" in page
    assert page.count("the node died before it answered") >= 2  # the error item and the turn's end
