"""Installs by role, from the built wheel into fresh virtual environments: the bare install serves the example
units and answers a tool call over HTTP; the agent command there names the extra it needs in one line; with
`[agent]` the installed runner takes one scripted turn against the installed server.

The wheels of the dependencies are kept in `.cache/wheelhouse` (ignored): a run installs with `--no-index` from
there and asks the package index only for what it lacks, once per run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from support.server_process import ServerProcess

from unit_mcp import __version__
from unit_mcp.extras import EXTRAS
from unit_mcp.testing import Match, ScriptedModel, call, say, tool_call

REPO = Path(__file__).resolve().parents[1]
WHEELHOUSE = REPO / ".cache" / "wheelhouse"

pytestmark = pytest.mark.slow


def _run(*command: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True, cwd=cwd, check=False)
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package's wheel, built from a copy of the sources, and the wheels of everything `[agent]` needs in
    the wheelhouse."""
    source = tmp_path_factory.mktemp("source")
    shutil.copy(REPO / "pyproject.toml", source)
    shutil.copy(REPO / "README.md", source)
    shutil.copytree(REPO / "unit_mcp", source / "unit_mcp", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", dist, source)
    (built,) = dist.glob("unit_mcp-*.whl")
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    fill = [sys.executable, "-m", "pip", "wheel", "--quiet", "--find-links", WHEELHOUSE, "-w", WHEELHOUSE]
    offline = subprocess.run([*map(str, fill), "--no-index", f"{built}[agent]"], capture_output=True, check=False)
    if offline.returncode != 0:
        _run(*fill, f"{built}[agent]")  # the one visit to the package index
    for copy in WHEELHOUSE.glob("unit_mcp-*.whl"):
        copy.unlink()
    return built


def fresh_venv(where: Path, requirement: str) -> Path:
    """A new virtual environment with `requirement` installed from the wheelhouse alone; its bin folder."""
    venv.EnvBuilder(with_pip=False).create(where)  # installed into by this pip (--python): ensurepip costs ~5 s CPU
    bin_dir = where / "bin"
    _run(
        sys.executable, "-m", "pip", "--python", bin_dir / "python", "install", "--quiet", "--no-compile", "--no-index",
        "--find-links", WHEELHOUSE, requirement,
    )  # fmt: skip  # --no-compile: pip would compile every installed module (the server then imports a few)
    return bin_dir


def serve(bin_dir: Path, tmp_path: Path, server_processes: list[ServerProcess]) -> dict[str, str]:
    """`unit-mcp serve` of that environment, on the example units: the lines it printed once ready."""
    program = [str(bin_dir / "unit-mcp"), "serve"]
    process = ServerProcess("--data-dir", str(tmp_path / "data"), tmp=tmp_path, program=program)
    server_processes.append(process)
    return process.ready(timeout=120)


async def list_units(url: str, token: str) -> list[str]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(60)) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):
        result = await client.call_tool("unit_list", {})
    assert not result.is_error, result
    assert result.structured_content is not None
    return [unit["unit_id"] for unit in result.structured_content["units"]]


def test_the_bare_install_is_the_server(wheel: Path, tmp_path: Path, server_processes: list[ServerProcess]) -> None:
    bin_dir = fresh_venv(tmp_path / "venv", str(wheel))
    assert _run(bin_dir / "unit-mcp", "--version").stdout == f"unit-mcp {__version__}\n"
    probe = "import importlib.util as u, json, sys; print(json.dumps([m for m in sys.argv[1:] if not u.find_spec(m)]))"
    absent = _run(bin_dir / "python", "-c", probe, *EXTRAS["agent"]).stdout
    assert json.loads(absent) == ["openai", "httpx"], "the server alone installs neither"
    for command in ([bin_dir / "unit-mcp", "agent", "sessions", "list"], [bin_dir / "python", "-m", "unit_mcp.fleet"]):
        done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, check=False)
        name = "agent" if "agent" in map(str, command) else "fleet"
        assert (done.returncode, done.stdout, done.stderr) == (
            1,
            "",
            f"unit-mcp {name}: error: needs the agent extra (openai, httpx not installed); install 'unit-mcp[agent]'\n",
        )
    traced = subprocess.run(  # tracing asked for without the otel extra: one line naming it
        [bin_dir / "unit-mcp", "serve", "--no-watch"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
        env={**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
    )
    assert (traced.returncode, traced.stdout, traced.stderr) == (
        1,
        "",
        "unit-mcp serve: error: needs the otel extra (opentelemetry.sdk, opentelemetry.exporter.otlp.proto.http not "
        "installed); install 'unit-mcp[otel]'\n",
    )
    printed = serve(bin_dir, tmp_path, server_processes)
    units = anyio.run(list_units, printed["MCP_URL"], printed["MCP_TOKEN"])
    assert {"greeter", "counter", "notes", "weather"} <= set(units), units


def test_the_agent_extra_runs_a_scripted_turn(
    wheel: Path, tmp_path: Path, server_processes: list[ServerProcess]
) -> None:
    bin_dir = fresh_venv(tmp_path / "venv", f"{wheel}[agent]")
    printed = serve(bin_dir, tmp_path, server_processes)
    script = [call(tool_call("unit_list")), say("the units are listed", when=Match(last_role="tool"))]
    agent = [bin_dir / "unit-mcp", "agent", "--data-dir", tmp_path / "sessions", "run"]
    with ScriptedModel(script) as model:
        done = subprocess.run(
            [*agent, "--mcp-url", printed["MCP_URL"], "--base-url", model.base_url, "--model", "scripted", "list them"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "MCP_TOKEN": printed["MCP_TOKEN"]},
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "the units are listed" in done.stdout
        assert "unit_list" in done.stderr and "greeter" in json.dumps(model.requests[1].model_dump(mode="json"))
