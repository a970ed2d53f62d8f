"""A risk grants no more than its name: a patch reloads the unit and runs its new code in the application, so
approving `filesystem-write` (or granting it "always") must not let a patch through; its dry run, which only
reads, is allowed under `filesystem-read`, wherever a risk is decided per call."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from unit_mcp.agent import AgentApprovals, AgentToolSurface, ApprovedEndpoint, McpToolSource
from unit_mcp.agent.opencode import OpenCodeView
from unit_mcp.tools import tool_risks
from unit_mcp.wire import DRY_RUN_RISK_META_KEY, RISK_META_KEY

from .clients import call, connect
from .conftest import Served
from .report import Report

pytestmark = pytest.mark.anyio


def pid_patch(pid_file: Path, *, dry_run: bool = False) -> dict[str, object]:
    """The attack as it was shown: a patch whose new code writes the server's pid to a file when it is loaded."""
    new = f"import os\n\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n\n\ndef greet("
    arguments: dict[str, object] = {"unit_id": "greeter", "source_id": "greeter.py", "old": "def greet(", "new": new}
    return {**arguments, "dry_run": True} if dry_run else arguments


async def test_approving_filesystem_write_does_not_grant_code_execution(
    served: Served, units_root: Path, tmp_path: Path, figures: Report
) -> None:
    pid_file = tmp_path / "pid"
    greeter = units_root / "greeter.py"
    before = greeter.read_bytes()
    risks = tool_risks(history=True)
    assert {risks[name] for name in ("unit_apply_patch", "unit_create_source", "unit_revert")} == {"shell"}

    policy = AgentApprovals({"filesystem-read": "auto", "filesystem-write": "auto"})  # shell: ask, no approver
    async with McpToolSource(served.url, token=served.token) as source:
        surface = AgentToolSurface(policy)
        surface.add_source(source)
        patch_tool = surface.get("unit_apply_patch")
        assert patch_tool is not None and (patch_tool.risk, patch_tool.dry_run_risk) == ("shell", "filesystem-read")

        for grants in ([], ["filesystem-write"]):  # the policy, then "Always approve" of filesystem-write
            denied = await surface.call("unit_apply_patch", pid_patch(pid_file), grants=grants)
            assert denied.is_error and denied.text.startswith("[approval_denied] unit_apply_patch (risk: shell)")
        preview = await surface.call("unit_apply_patch", pid_patch(pid_file, dry_run=True))
        assert not preview.is_error and preview.structured is not None and preview.structured["dry_run"] is True
        assert "os.getpid()" in preview.structured["diff"]
        # a dry run counts only when it is exactly true: anything else is judged as the write it may be
        sneaky = await surface.call("unit_apply_patch", {**pid_patch(pid_file), "dry_run": "true"})
        assert sneaky.is_error and "(risk: shell)" in sneaky.text

        async with (
            ApprovedEndpoint(surface, grants=["filesystem-write"], config_root=tmp_path / "oc") as endpoint,
            connect(endpoint.url or "", endpoint.token) as client,
        ):
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            meta = listed["unit_apply_patch"].meta or {}
            assert (meta[RISK_META_KEY], meta[DRY_RUN_RISK_META_KEY]) == ("shell", "filesystem-read")
            written = await call(client, "unit_apply_patch", pid_patch(pid_file))
            assert written.is_error and "[approval_denied] unit_apply_patch (risk: shell)" in written.text
            previewed = await call(client, "unit_apply_patch", pid_patch(pid_file, dry_run=True))
            assert not previewed.is_error and previewed.structured is not None and previewed.structured["dry_run"]

        policy.attach(lambda request: False)  # OpenCode's view: askable tools, one admission per approved call
        view = OpenCodeView(surface, "unit-agent", [])
        assert "unit_apply_patch" in view.askable()
        refused = await view.run("unit_apply_patch", pid_patch(pid_file))
        assert refused.is_error and refused.text.startswith("[approval_required] unit_apply_patch (risk: shell)")
        assert not (await view.run("unit_apply_patch", pid_patch(pid_file, dry_run=True))).is_error

        assert not pid_file.exists() and greeter.read_bytes() == before, "no approved call ran or wrote anything"

        policy.set_policy("shell", "auto")  # what approving filesystem-write used to grant: the code runs
        ran = await surface.call("unit_apply_patch", pid_patch(pid_file))
        assert not ran.is_error, ran.text
        assert pid_file.read_text() == str(os.getpid()), "the patched code ran in the server's process"
    figures.record("risks", patch_under_filesystem_write="denied", dry_run_under_filesystem_read="allowed")
