"""The embedding recipe of docs/python.md, run as written (paths and port filled in): it serves the application and
the MCP server, and a SIGINT or SIGTERM stops it with exit 0, no traceback and nothing left in its temporary
folder (the OpenCode config holds the token). The unit page and confirmations embed from the public names."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from conftest import EXAMPLE_UNITS

from unit_mcp import Bridge, Confirmations, Host, UnitService, UnitsUI, UnitTools
from unit_mcp.loopback import bind_loopback

REPO = Path(__file__).resolve().parent.parent


def recipe() -> str:
    text = (REPO / "docs" / "python.md").read_text(encoding="utf-8")
    section = text.split("## Embedding the server in an application", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    return block.group(1)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_embedding_recipe_serves_and_stops_cleanly_on_a_signal(tmp_path: Path, signum: signal.Signals) -> None:
    units, data, temporary = tmp_path / "units", tmp_path / "data", tmp_path / "tmp"
    shutil.copytree(EXAMPLE_UNITS, units, ignore=shutil.ignore_patterns("__pycache__"))
    temporary.mkdir()
    probe = bind_loopback("127.0.0.1", 0)
    port = probe.getsockname()[1]
    probe.close()
    source = recipe()
    for placeholder, value in [('"path/to/units"', repr(str(units))), ('"path/to/data"', repr(str(data)))]:
        assert placeholder in source
        source = source.replace(placeholder, value)
    assert "port=8000" in source
    script = tmp_path / "app.py"
    script.write_text(source.replace("port=8000", f"port={port}"))
    process = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(temporary), "HOME": str(tmp_path)},
        cwd=tmp_path,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("MCP_URL http://127.0.0.1:"), line
        assert any(temporary.iterdir()), "the bridge's OpenCode config is in the temporary folder while it serves"
        answer = httpx.post(f"http://127.0.0.1:{port}/units/counter/increment", timeout=30)
        assert answer.json() == {"count": 1}
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert list(temporary.iterdir()) == [], "nothing is left in the temporary folder"


@pytest.mark.anyio
async def test_the_unit_page_and_confirmations_embed_from_the_public_names(host: Host) -> None:
    service, confirmations = UnitService(host), Confirmations(["destructive"], on_page=True)
    page = UnitsUI(service, confirmations=confirmations)
    tools = UnitTools(service, confirmations=confirmations)
    async with (
        Bridge(tools.server(), pages={"/units": page.app}) as bridge,
        httpx.AsyncClient(timeout=30, follow_redirects=True) as client,
    ):
        opened = await client.get(page.login_url(f"{bridge.base_url}/units"))
        assert opened.status_code == 200 and "<html" in opened.text
