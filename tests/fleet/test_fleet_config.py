"""The fleet without live nodes: node arguments, the capability summary of a node's config, a node that does
not answer (a real closed port, and a real socket that never answers: the escalation), the tools' risk labels
and argument ranges, and the command line's refusals."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp import Client

from unit_mcp.fleet import Fleet, FleetError, FleetTools, NodeSpec, capability_summary, node_specs
from unit_mcp.fleet.nodes import permission_mode
from unit_mcp.wire import ERROR_META_KEY, RISK_META_KEY, RISKS

pytestmark = pytest.mark.anyio


def test_node_arguments() -> None:
    spec = NodeSpec.parse("build=http://me@127.0.0.1:4096/", username="x", password="shared")
    assert spec == NodeSpec("build", "http://127.0.0.1:4096", "me", "shared")
    env = {"FLEET_PASSWORD": "p", "FLEET_PASSWORD_REVIEW_2": "own"}
    shared = node_specs(["a=http://127.0.0.1:1", "b=http://[::1]:2", "review-2=http://h:3"], env=env)
    assert [(s.url, s.username, s.password) for s in shared] == [
        ("http://127.0.0.1:1", "opencode", "p"),
        ("http://[::1]:2", "opencode", "p"),
        ("http://h:3", "opencode", "own"),
    ]
    assert node_specs(["a=http://h:1"], env={"FLEET_PASSWORD": "env"}, password="file")[0].password == "file"
    for bad, message in [
        ("build=http://me:s3cret@h:1", "node build: a password in the URL is readable by every local user"),
        ("nourl", "a node is NAME=URL"),
        ("a=ftp://h", "is not an http(s) URL"),
        ("a b=http://h:1", "may use only letters"),
    ]:
        with pytest.raises(FleetError, match=re.escape(message)):
            NodeSpec.parse(bad)
    with pytest.raises(FleetError, match="given twice: a"):
        node_specs(["a=http://h:1", "a=http://h:2"], env={})
    with pytest.raises(FleetError, match="at least one --node"):
        node_specs([], env={})


@pytest.mark.parametrize(
    ("permission", "expected"),
    [
        (None, "No permission rules are configured"),
        ("allow", "Everything is allowed."),
        ({"*": "deny"}, "Everything is denied"),
        ({"*": "ask"}, "Everything asks for approval. A rule that asks blocks a headless node"),
        (
            {"*": "deny", "edit": {"*": "deny", "/tmp/*": "allow"}, "bash": "ask"},
            "Tools not listed: deny. Asks: bash. Mixed rules: edit mixed (*: deny, /tmp/*: allow).",
        ),
    ],
)
def test_capability_summary(permission: object, expected: str) -> None:
    config = {"model": "p/m"} | ({"permission": permission} if permission is not None else {})
    summary = capability_summary(config, {"units": {"status": "failed", "error": "x"}})
    assert expected in summary.summary and summary.summary.endswith("MCP servers: units failed.")
    assert summary.model == "p/m"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again before the fleet calls it: nothing listens there


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that takes connections (the kernel's backlog) but never answers a request."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield int(sock.getsockname()[1])


async def test_a_node_that_does_not_answer_is_reported_not_fatal() -> None:
    port = closed_port()
    async with Fleet([NodeSpec("gone", f"http://127.0.0.1:{port}")], timeout=2) as fleet:
        health = await fleet.health("gone")
        assert not health.healthy and "did not answer GET /global/health" in (health.error or "")
        assert health.escalation is not None and "Do not dispatch to node gone" in health.escalation.next_step
        tools = FleetTools(fleet)
        failed = await tools.call("fleet_send_message", {"node": "gone", "message": "hello"})
        assert failed.is_error and failed.content[0].text.startswith("[node_error] OpenCode node")  # type: ignore[union-attr]
        assert failed.meta is not None and failed.meta[ERROR_META_KEY]["code"] == "node_error"
        unknown = await tools.call("fleet_nope", {})
        assert unknown.is_error and "use one of: fleet_list_nodes" in unknown.content[0].text  # type: ignore[union-attr]
        listed = await tools.call("fleet_list_nodes", {})
        assert listed.structured_content is not None
        (node,) = listed.structured_content["nodes"]
        permission = node.pop("permission")
        assert node == {
            "name": "gone",
            "url": f"http://127.0.0.1:{port}",
            "event_stream": "reconnecting",
            "session_id": None,
        }
        assert permission.startswith("not checked: its config could not be read (")
        assert permission.endswith("; fleet_node_health reads it again")
        assert fleet.blocking() == [], "a node not read is not reported as blocking"


def test_the_command_line_refuses_bad_arguments() -> None:
    for args, message in [
        ([], "give at least one --node NAME=URL"),
        (["--node", "a=http://h:1", "--host", "0.0.0.0"], "is not a loopback address"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "unit_mcp.fleet", *args], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 2 and message in done.stderr


async def test_a_health_check_that_times_out_escalates(silent_port: int) -> None:
    url = f"http://127.0.0.1:{silent_port}"
    async with Fleet([NodeSpec("hung", url)], timeout=1) as fleet:
        answer = await FleetTools(fleet).call("fleet_node_health", {"node": "hung"})
    assert not answer.is_error and answer.structured_content is not None
    health = answer.structured_content
    assert not health["healthy"] and "Timeout" in health["error"]
    escalation = health["escalation"]
    assert escalation["tried"] == [f"{health['error']} (waited up to 1 s)"]
    assert len(escalation["check"]) == 3 and f"curl {url}/global/health" in escalation["check"][0]
    assert "Do not dispatch to node hung" in escalation["next_step"]
    assert "call fleet_node_health again later" in escalation["next_step"]


async def test_every_tool_has_a_risk_label_and_limit_is_refused_outside_its_range() -> None:
    async with (
        Fleet([NodeSpec("gone", f"http://127.0.0.1:{closed_port()}")], timeout=2) as fleet,
        Client(FleetTools(fleet).server()) as client,
    ):
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        risks = {name: (tool.meta or {}).get(RISK_META_KEY) for name, tool in listed.items()}
        assert set(risks.values()) <= set(RISKS) and None not in risks.values(), risks
        assert risks["fleet_send_message"] == "shell" and risks["fleet_reset_session"] == "destructive"
        assert "may run anything its own permission rules allow" in (listed["fleet_send_message"].description or "")
        assert [name for name, risk in risks.items() if risk == "normal"] == [
            name for name in listed if name not in ("fleet_send_message", "fleet_reset_session")
        ]
        limit = listed["fleet_get_session_messages"].input_schema["properties"]["limit"]
        assert (limit["minimum"], limit["maximum"]) == (1, 100)
        for bad in (0, 101):
            arguments: dict[str, Any] = {"node": "gone", "session_id": "ses_x", "limit": bad}
            refused = await client.call_tool("fleet_get_session_messages", arguments)
            assert refused.is_error and refused.meta is not None
            assert refused.meta[ERROR_META_KEY]["code"] == "invalid_argument"
            assert "limit: Input should be" in refused.content[0].text  # type: ignore[union-attr]


ACTIONS = st.sampled_from(["allow", "deny", "ask"])
RULE = ACTIONS | st.dictionaries(st.sampled_from(["*", "*.py", "src/**", "git *"]), ACTIONS, min_size=1)


@given(
    default=st.none() | ACTIONS,
    rules=st.dictionaries(st.sampled_from(["bash", "edit", "read", "webfetch", "unit_*"]), RULE, max_size=4),
)
def test_a_node_would_block_exactly_when_a_rule_asks_or_none_is_configured(
    default: str | None, rules: dict[str, Any]
) -> None:
    permission: dict[str, Any] = {**({"*": default} if default else {}), **rules}
    capabilities = capability_summary({"permission": permission}, {})
    blocks, line = permission_mode(capabilities)
    actions = {default, *(a for r in rules.values() for a in ([r] if isinstance(r, str) else r.values()))} - {None}
    assert blocks == ("ask" in actions or not permission)
    assert line.startswith("would block on a question: " if blocks else "never asks: ")
    asking = sorted(t for t, r in rules.items() if (r == "ask" if isinstance(r, str) else "ask" in r.values()))
    if asking:
        assert line.startswith(f"would block on a question: {', '.join(asking)} ask") or default == "ask"
