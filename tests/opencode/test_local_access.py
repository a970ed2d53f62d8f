"""The escape hatch (`--allow-local-access`) on the real OpenCode binary with the scripted model.

`python -m unit_mcp.server --allow-local-access --confirm none` runs as a child process on a copy of the example
units; each OpenCode session is started from the printed OPENCODE_CMD (`run`, the scripted model from the user's
OPENCODE_CONFIG). Before a grant, OpenCode's edit tool is denied; an MCP client asks for local access to `counter`
and a person approves it on the unit server's page (a request always asks, even with --confirm none); a new
session edits the unit through the granted folder, and the watcher reloads it; an edit outside that folder and a
shell command are denied; after the page revokes the grant and a second grant expires, an edit through either
folder is denied. The change log holds every step, the edit attributed to the grant's id.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from support.server_process import ServerProcess
from ui.conftest import page_client

from unit_mcp import Host, UnitService
from unit_mcp.changelog import Caller
from unit_mcp.confirm import Confirmations
from unit_mcp.errors import InvalidArgument, NotSupported, UnknownUnit
from unit_mcp.localaccess import LOCAL_ACCESS_CLIENT, LocalAccess
from unit_mcp.opencode_isolation import local_access_dir, opencode_config, plan_launch, write_opencode_config
from unit_mcp.server import parse_args
from unit_mcp.testing import Match, ScriptedModel, call, say, tool_call
from unit_mcp.tools import UnitTools, tool_risks
from unit_mcp.units import open_loader
from unit_mcp.wire import ERROR_META_KEY

from .opencode_stack import EXAMPLE_UNITS, scripted_provider, title_step

pytestmark = pytest.mark.anyio
SERVER = "unit-dev"
WAIT = 120  # generous bound on a wait that ends as soon as its condition holds
REQUEST = "unit_request_local_access"
NATIVE = {"read", "edit", "write", "bash", "glob", "grep", "webfetch", "task"}
UNOFFERED = "Model tried to call unavailable tool"
RULE = "The user has specified a rule which prevents you from using this specific tool call"
CLIENT = types.Implementation(name="local-access-test", version="1")


@dataclass
class Session:
    """What one `"$OPENCODE_CMD" run` printed and what the model was offered."""

    uses: list[dict[str, Any]]
    offered: set[str]
    explain: str

    def status(self, tool: str) -> list[str]:
        return [u["state"]["status"] for u in self.uses if u["tool"] == tool]

    def refused(self, tool: str, why: str) -> bool:
        """The one call of `tool` failed for `why` (UNOFFERED, RULE)."""
        errors = [str(u["state"].get("error")) for u in self.uses if u["tool"] == tool]
        return self.status(tool) == ["error"] and len(errors) == 1 and why in errors[0]

    def denied(self, tool: str) -> bool:
        """OpenCode offered none of its own tools, so a call of `tool` failed."""
        return self.offered.isdisjoint(NATIVE) and self.refused(tool, UNOFFERED)


@dataclass
class Stack:
    server: ServerProcess
    printed: dict[str, str]
    units: Path
    data: Path
    world: Path
    binary: Path
    page: httpx.AsyncClient

    @property
    def origin(self) -> dict[str, str]:
        return {"Origin": self.printed["MCP_URL"].removesuffix("/mcp")}

    @asynccontextmanager
    async def client(self) -> AsyncIterator[Client]:
        headers = {"Authorization": f"Bearer {self.printed['MCP_TOKEN']}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http,
            Client(streamable_http_client(self.printed["MCP_URL"], http_client=http), client_info=CLIENT) as client,
        ):
            yield client

    async def request_access(self, unit_id: str, minutes: float) -> dict[str, Any]:
        """Ask for local access over MCP and approve the question on the page once it shows there."""
        results: list[types.CallToolResult] = []
        async with self.client() as client, anyio.create_task_group() as tasks:

            async def ask() -> None:
                args = {"unit_id": unit_id, "reason": "edit the unit with OpenCode's own tools", "minutes": minutes}
                results.append(await client.call_tool(REQUEST, args))

            tasks.start_soon(ask)
            with anyio.fail_after(WAIT):
                while not (found := re.search(r'data-question="(\d+)"', (await self.page.get("/")).text)):
                    await anyio.sleep(0.1)
            approved = await self.page.post(f"/questions/{found.group(1)}/approve", headers=self.origin)
            assert approved.status_code == 303, approved.text
        [result] = results
        assert not result.is_error and result.structured_content is not None, result
        return dict(result.structured_content)

    async def changes(self, unit_id: str) -> list[dict[str, Any]]:
        """The change log of `unit_id`, oldest first."""
        async with self.client() as client:
            done = await client.call_tool("unit_changes", {"unit_id": unit_id})
        assert not done.is_error and done.structured_content is not None, done
        return list(reversed(done.structured_content["changes"]))

    async def until_change(self, unit_id: str, holds: Any) -> list[dict[str, Any]]:
        with anyio.fail_after(WAIT):
            while True:
                changes = await self.changes(unit_id)
                if any(holds(c) for c in changes):
                    return changes
                await anyio.sleep(0.2)

    async def opencode(self, *steps: Any) -> Session:
        """One `"$OPENCODE_CMD" run` with the scripted model answering `steps` to the prompt."""
        async with ScriptedModel([title_step(), *steps]) as model:
            (self.world / "tmp").mkdir(parents=True, exist_ok=True)
            config = self.world / "user-opencode.json"
            config.write_text(json.dumps(scripted_provider(model.base_url)), encoding="utf-8")
            env = {
                "PATH": "/usr/bin:/bin",
                "HOME": str(self.world / "home"),
                "TMPDIR": str(self.world / "tmp"),
                "OPENCODE_PATH": str(self.binary),
                "OPENCODE_CONFIG": str(config),
                "OPENCODE_DISABLE_MODELS_FETCH": "1",
                "OPENCODE_DISABLE_AUTOUPDATE": "1",
            }
            with anyio.fail_after(WAIT):
                run = await anyio.run_process(
                    [self.printed["OPENCODE_CMD"], "run", "--format", "json", "Do", "it."],
                    cwd=self.world,
                    env=env,
                    check=False,
                )
            output = run.stdout.decode()
            explain = f"exit {run.returncode}\nstdout:\n{output[-4000:]}\nstderr:\n{run.stderr.decode()[-3000:]}"
            assert run.returncode == 0, explain
            model.assert_done()
            offered = {name for r in model.requests for name in r.tool_names}
        events = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
        uses = [e["part"] for e in events if e.get("type") == "tool_use"]
        return Session(uses, offered, explain)


def first(*calls: Any) -> Any:
    return call(*calls, when=Match(last_role="user", has_tools=True))


def then(*calls: Any) -> Any:
    return call(*calls, when=Match(last_role="tool"))


def edit(path: Path, old: str, new: str) -> Any:
    return tool_call("edit", {"filePath": str(path), "oldString": old, "newString": new})


def done() -> Any:
    return say("done", when=Match(last_role="tool"))


@asynccontextmanager
async def stack(tmp_path: Path, binary: Path) -> AsyncIterator[Stack]:
    units = tmp_path / "units"
    shutil.copytree(EXAMPLE_UNITS, units, ignore=shutil.ignore_patterns("__pycache__"))
    data = tmp_path / "server-data"
    server = ServerProcess(
        "--units", str(units), "--data-dir", str(data), "--allow-local-access", "--confirm", "none", tmp=tmp_path
    )
    try:
        printed = server.ready(60, last="UNITS_UI_URL")
        async with page_client(printed["UNITS_UI_URL"]) as page:
            yield Stack(server, printed, units, data, tmp_path / "user", binary, page)
    finally:
        assert server.stop() == 0, server.stderr()


async def test_local_access_on_the_real_opencode(tmp_path: Path, opencode_binary: Path) -> None:
    async with stack(tmp_path, opencode_binary) as s:
        counter = s.units / "counter" / "__init__.py"
        weather = s.units / "weather" / "__init__.py"
        weather_before = weather.read_bytes()

        # Before any grant: the edit tool is not OpenCode's to use (a call of it fails), the file is untouched.
        before = await s.opencode(first(edit(counter, "step = 1", "step = 9")), done())
        assert before.denied("edit"), before.explain
        assert "step = 1\n" in counter.read_text()

        # The yes on the page: the unit's folder as a source handle, through a link, with its expiry.
        grant = await s.request_access("counter", minutes=30)
        assert grant["source_handle"]["kind"] == "local-folder"  # a tag is sent, though results leave defaults out
        link = Path(grant["source_handle"]["path"])
        assert grant["source_handle"]["folder"] == str(counter.parent) and link.resolve() == counter.parent
        assert link.parent == local_access_dir(Path(s.printed["OPENCODE_XDG_CONFIG_HOME"]))
        assert "$OPENCODE_CMD" in grant["restart"] and grant["expires_at"]
        shown = (await s.page.get("/")).text
        assert f'data-local-grant="{grant["grant_id"]}"' in shown and "edit the unit with OpenCode" in shown

        # A session started now reads and edits inside the folder; the watcher reloads the unit.
        inside = await s.opencode(
            first(tool_call("read", {"filePath": str(link / "__init__.py")})),
            then(
                tool_call(
                    "edit", {"filePath": str(link / "__init__.py"), "oldString": "step = 1", "newString": "step = 2"}
                )
            ),
            done(),
        )
        assert {"read", "edit", "write"} <= inside.offered and inside.offered.isdisjoint({"bash", "glob", "webfetch"})
        assert inside.status("read") == ["completed"] and inside.status("edit") == ["completed"], inside.explain
        assert "step = 2\n" in counter.read_text()
        changes = await s.until_change("counter", lambda c: c["outcome"] == "outside")
        [outside] = [c for c in changes if c["outcome"] == "outside"]
        assert outside["client"] == {"name": LOCAL_ACCESS_CLIENT, "version": None, "session_id": grant["grant_id"]}
        assert outside["error_code"] is None and [x["source_id"] for x in outside["sources"]] == ["__init__.py"]
        log = (s.data / "logs" / "app.log").read_text(encoding="utf-8")
        assert "unit counter reloaded after a change in the store" in log

        # Outside the folder (another unit, the unit's own folder by its real path) and the shell: denied.
        write = tool_call("write", {"filePath": str(weather), "content": "x = 1\n"})
        touch = tool_call("bash", {"command": f"touch {tmp_path}/shell-ran", "description": "touch"})
        elsewhere = await s.opencode(first(write, tool_call("read", {"filePath": str(counter)}), touch), done())
        assert elsewhere.refused("write", RULE) and elsewhere.refused("read", RULE), elsewhere.explain
        assert elsewhere.refused("bash", UNOFFERED) and "bash" not in elsewhere.offered, elsewhere.explain
        assert weather.read_bytes() == weather_before and not (tmp_path / "shell-ran").exists()

        # Revoked on the page: the link leads nowhere. A second grant that expires: its link goes too.
        revoked = await s.page.post(f"/local-access/{grant['grant_id']}/revoke", headers=s.origin)
        assert revoked.status_code == 303, revoked.text
        assert not link.is_dir() and f'data-local-grant="{grant["grant_id"]}"' not in (await s.page.get("/")).text
        short = await s.request_access("counter", minutes=0.05)
        await s.until_change("counter", lambda c: (c["message"] or "").startswith("expired"))
        short_link = Path(short["source_handle"]["path"])
        assert not short_link.is_dir()

        # A session started after both: no rule of either grant is left (the model is offered none of OpenCode's
        # own tools), so an edit through either folder fails. One session checks both (each session costs
        # OpenCode's start-up): a rule the revoke left behind would offer the tools again.
        after = await s.opencode(
            first(
                tool_call(
                    "edit", {"filePath": str(link / "__init__.py"), "oldString": "step = 2", "newString": "step = 3"}
                ),
                tool_call(
                    "edit",
                    {"filePath": str(short_link / "__init__.py"), "oldString": "step = 2", "newString": "step = 4"},
                ),
            ),
            done(),
        )
        assert after.status("edit") == ["error", "error"] and after.offered.isdisjoint(NATIVE), after.explain
        assert "step = 2\n" in counter.read_text()

        # Every step in the change log, in order.
        steps = [
            (c["tool"], c["outcome"], c["client"]["name"], (c["message"] or "").split(" ")[0])
            for c in await s.changes("counter")
        ]
        asked_and_approved = [
            (REQUEST, "asked", CLIENT.name, "question"),
            (REQUEST, "approved", CLIENT.name, "question"),
        ]
        assert steps == [
            *asked_and_approved,
            (REQUEST, "applied", CLIENT.name, "granted"),
            (None, "outside", LOCAL_ACCESS_CLIENT, ""),
            (REQUEST, "applied", "unit-mcp page", "revoked:"),
            *asked_and_approved,
            (REQUEST, "applied", CLIENT.name, "granted"),
            (REQUEST, "applied", LOCAL_ACCESS_CLIENT, "expired:"),
        ], steps


# -- the parts, without a session ------------------------------------------------------------------------------


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    units = tmp_path / "units"
    shutil.copytree(EXAMPLE_UNITS, units, ignore=shutil.ignore_patterns("__pycache__"))
    with Host(units, tmp_path / "host-data", namespace=f"local_access_{secrets.token_hex(4)}") as host:
        yield host


def test_a_request_is_refused_where_no_real_folder_can_be_named(tmp_path: Path, host: Host) -> None:
    service = UnitService(host)
    with pytest.raises(NotSupported, match="--allow-local-access"):
        service.request_local_access("counter", "edit it")
    service = UnitService(host, local_access=LocalAccess(tmp_path / "oc", host))
    with pytest.raises(NotSupported, match=r"single file \(greeter\.py\)"):
        service.request_local_access("greeter", "edit it")
    with pytest.raises(UnknownUnit):
        service.request_local_access("nosuch", "edit it")
    with pytest.raises(InvalidArgument, match="minutes"):
        service.request_local_access("counter", "edit it", minutes=0)
    assert service.local_access is not None
    assert service.local_access.grants() == [] and list(service.local_access.folder.iterdir()) == [
        service.local_access.folder / "grants.json"
    ]

    database = open_loader(f"sqlite:{tmp_path / 'units.db'}")
    database.put_unit("counter", "directory", {"__init__.py": b"step = 1\n"}, replace=False)
    with Host(database, tmp_path / "db-data", namespace=f"local_access_{secrets.token_hex(4)}") as db_host:
        db_service = UnitService(db_host, local_access=LocalAccess(tmp_path / "oc-db", db_host))
        with pytest.raises(NotSupported, match="lives in a database"):
            db_service.request_local_access("counter", "edit it")


async def test_the_request_is_offered_only_when_allowed_and_always_asks(tmp_path: Path, host: Host) -> None:
    plain = UnitTools(UnitService(host))
    assert REQUEST not in {tool.name for tool in plain.tools} and REQUEST not in tool_risks()
    assert tool_risks(local_access=True)[REQUEST] == "destructive"

    service = UnitService(host, local_access=LocalAccess(tmp_path / "oc", host))
    # No --confirm at all, and a page's grant of 'destructive' for this very client: still nobody may skip the yes.
    confirmations = Confirmations(["destructive"])
    confirmations.grant(Caller(name=CLIENT.name, version=CLIENT.version), "destructive", 10)
    for asking in (None, confirmations):
        tools = UnitTools(service, confirmations=asking)
        assert REQUEST in {tool.name for tool in tools.tools}
        async with Client(tools.server(), client_info=CLIENT) as client:
            result = await client.call_tool(REQUEST, {"unit_id": "counter", "reason": "edit it"})
        assert result.is_error and result.meta is not None and result.meta[ERROR_META_KEY]["code"] == "declined"
    assert service.local_access.grants() == []

    # The person reads the folder, the minutes and the reason; a request that could not be granted is not asked.
    on_page = Confirmations([], on_page=True)
    tools = UnitTools(service, confirmations=on_page)
    results: list[types.CallToolResult] = []
    async with Client(tools.server(), client_info=CLIENT) as client, anyio.create_task_group() as tasks:

        async def ask() -> None:
            results.append(await client.call_tool(REQUEST, {"unit_id": "counter", "reason": "rename", "minutes": 5}))

        tasks.start_soon(ask)
        with anyio.fail_after(WAIT):
            while not on_page.questions():
                await anyio.sleep(0.02)
        [question] = on_page.questions()
        assert on_page.answer(question.id, False, by="the test")
        file_unit = await client.call_tool(REQUEST, {"unit_id": "greeter", "reason": "rename"})
    assert results[0].meta is not None and results[0].meta[ERROR_META_KEY]["code"] == "declined"
    assert file_unit.meta is not None and file_unit.meta[ERROR_META_KEY]["code"] == "not_supported"
    folder = Path(host.loader.location) / "counter"
    assert f"Open {folder} to OpenCode's own read and edit tools for 5 minutes" in (question.diff or "")
    assert "Reason given: rename" in (question.diff or "") and on_page.questions() == []


def test_a_launch_gets_the_rules_of_the_live_grants_only(tmp_path: Path, host: Host, opencode_binary: Path) -> None:
    config_home = tmp_path / "oc"
    write_opencode_config(config_home, opencode_config(url="http://127.0.0.1:9/mcp", server_name=SERVER, token="t"))
    access = LocalAccess(config_home, host)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "OPENCODE_PATH": str(opencode_binary)}

    def permission() -> dict[str, Any]:
        launch = plan_launch(config_home, ["debug", "config"], env)
        return dict(json.loads(launch.env["OPENCODE_CONFIG_CONTENT"])["permission"])

    deny_all = {"*": "deny", f"{SERVER}_*": "allow"}
    assert permission() == deny_all
    grant = access.grant("counter", Path(host.loader.location) / "counter", "r", 5, Caller())
    inside = str(grant.link.relative_to("/")) + "/*"
    assert permission() == {
        **deny_all,
        "external_directory": {"*": "deny", f"{grant.link}/*": "allow"},
        "read": {"*": "deny", inside: "allow"},
        "edit": {"*": "deny", inside: "allow"},
    }
    assert access.caller_for("counter") == Caller(name=LOCAL_ACCESS_CLIENT, session_id=grant.id)
    assert access.caller_for("weather") == Caller()

    # A grants file listing a link that is not one, or a grant past its time, grants nothing.
    (config_home / "local-access" / "grants.json").write_text(
        json.dumps({"grants": [{"id": grant.id, "expires": 1.0}, {"id": "la-000000000000", "expires": 4e9}]})
    )
    assert permission() == deny_all
    (config_home / "local-access" / "grants.json").write_text("not json")
    assert permission() == deny_all

    assert access.revoke(grant.id, Caller(name="someone")) and not access.revoke(grant.id, Caller())
    assert permission() == deny_all and grant.link.is_file() and not grant.link.is_symlink()
    with pytest.raises(NotADirectoryError):
        (grant.link / "new.py").write_text("x = 1\n")
    records = [
        (c.tool, c.caller.name, (c.message or "").split(" ")[0]) for c in host.changes.changes(unit_id="counter")
    ]
    assert records == [(REQUEST, "someone", "revoked:"), (REQUEST, None, "granted")]


def test_local_access_needs_the_http_server() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--stdio", "--allow-local-access"])
    assert parse_args([]).allow_local_access is False
