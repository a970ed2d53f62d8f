"""The master's launch line: `python -m unit_mcp.fleet` prints an OPENCODE_CMD that starts the real (pinned)
OpenCode isolated like the unit server's, in the hostile-config world of the OpenCode suite: the fleet server
the only MCP server, every native tool denied, no hostile server, plugin or instruction."""

from __future__ import annotations

import json
from pathlib import Path

from opencode.test_isolation import debug_config, hostile_world
from support.server_process import ServerProcess

SERVER = "opencode-fleet"  # the fleet's default --server-name


def test_the_masters_opencode_cmd_is_isolated(tmp_path: Path, opencode_binary: Path) -> None:
    fleet = ServerProcess("--node", "a=http://127.0.0.1:9", tmp=tmp_path, module="unit_mcp.fleet")
    try:
        printed = fleet.ready()
        launcher = printed["OPENCODE_CMD"]
        assert Path(launcher).is_file() and Path(launcher).parent.parent == Path(printed["OPENCODE_XDG_CONFIG_HOME"])
        world = hostile_world(tmp_path, "http://127.0.0.1:9")
        world.env["OPENCODE_PATH"] = str(opencode_binary)
        shown = debug_config([launcher], world, shell="sh")
        assert shown.returncode == 0, shown.stderr[-3000:]
        resolved = json.loads(shown.stdout)
    finally:
        assert fleet.stop() == 0
    assert resolved["permission"] == {"*": "deny", f"{SERVER}_*": "allow"}, resolved["permission"]
    assert list(resolved["mcp"]) == [SERVER] and resolved["mcp"][SERVER]["url"] == printed["MCP_URL"]
    assert resolved["plugin"] == [] and resolved["agent"] == {} and "instructions" not in resolved
    assert world.started() == []  # no hostile MCP server started, no hostile plugin loaded
    assert not Path(launcher).exists()  # removed with the fleet's temporary config folder
