"""The project's scripts as a newcomer meets them on a machine missing a tool: one line naming it."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import httpx
import pytest
from support.processes import running
from support.server_process import ServerProcess

REPO = Path(__file__).resolve().parents[1]


def test_scripts_test_names_a_missing_tool_in_one_line(tmp_path: Path) -> None:
    """A PATH with Python, git and the shell's basics but no npm: scripts/test stops before installing anything."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(Path(sys.executable).resolve())
    for tool in ("git", "dirname", "bash"):
        found = shutil.which(tool)
        assert found is not None, f"{tool} is needed to run this test"
        (bin_dir / tool).symlink_to(found)
    done = subprocess.run(
        [str(bin_dir / "bash"), "scripts/test"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "scripts/test: npm is not installed; the external checks, OpenCode and Codex tests install their pinned "
        "tools with it (Debian: apt-get install npm)"
    ]


def fake_project(tmp_path: Path, python_body: str) -> Path:
    """A git work tree holding the real scripts/test, with every step it runs replaced by a stub; the stub
    `.venv/bin/python` (which runs pytest) executes `python_body`, as a test run would."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "test", repo / "scripts" / "test")
    script = (REPO / "scripts" / "test").read_text()
    steps = set(re.findall(r"(?<![\w/.])scripts/[\w-]+", script)) - {"scripts/test"}  # every set-up step it runs
    assert {"scripts/bootstrap", "scripts/npm-tools"} <= steps, "scripts/test changed shape: update this stub list"
    stubs = dict.fromkeys(steps, "")
    stubs |= {
        ".venv/bin/ruff": "",
        ".venv/bin/mypy": "",
        ".venv/bin/lint-imports": "",
        ".venv/bin/python": f'case "$*" in *--collect-only*) exit 0 ;; esac\n{python_body}',  # not the warm-up
        "bin/npm": "",
    }
    for name, body in stubs.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    (repo / ".gitignore").write_text(".venv/\nbin/\nignored/\n")
    (repo / "tracked.txt").write_text("as committed\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "-C", str(repo), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-qm", "init"], check=True)
    return repo


def run_scripts_test(repo: Path) -> subprocess.CompletedProcess[str]:
    path = f"{repo / 'bin'}:{Path(sys.executable).resolve().parent}:/usr/bin:/bin"
    return subprocess.run(
        ["bash", "scripts/test"], cwd=repo, capture_output=True, text=True, timeout=60, env={"PATH": path}
    )


def test_scripts_test_fails_in_one_line_when_the_run_changes_the_work_tree(tmp_path: Path) -> None:
    writes = "echo rewritten > tracked.txt; echo new > report.md; mkdir ignored; echo fine > ignored/x"
    repo = fake_project(tmp_path, writes)
    done = run_scripts_test(repo)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "scripts/test: the run changed the work tree (report.md tracked.txt); tests must write to tmp_path or an "
        "ignored folder"
    ]


def test_scripts_test_accepts_a_tree_that_was_dirty_before_and_that_the_run_leaves_alone(tmp_path: Path) -> None:
    repo = fake_project(tmp_path, "mkdir -p ignored; echo output > ignored/report.md")
    (repo / "tracked.txt").write_text("a developer's edit\n")
    (repo / "notes.txt").write_text("untracked, the developer's\n")
    done = run_scripts_test(repo)
    assert done.returncode == 0, done.stderr
    assert (repo / "ignored" / "report.md").exists(), "the stubbed test run did run"


def test_a_failed_set_up_step_ends_the_run_with_its_output_and_runs_no_test(tmp_path: Path) -> None:
    """The set-up steps run side by side: one that fails (here the Codex install) is named, its output shown, the
    others still finish, and pytest does not start."""
    repo = fake_project(tmp_path, "echo pytest ran > ran.txt")
    (repo / "scripts" / "codex-tool").write_text("#!/bin/sh\necho 'codex: download refused' >&2\nexit 3\n")
    (repo / "scripts" / "postgres-tool").write_text("#!/bin/sh\nsleep 0.5\necho postgres-done > pg.txt\n")
    done = run_scripts_test(repo)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-2:] == [
        "codex: download refused",
        "scripts/test: the set-up step 'scripts/codex-tool' failed (its output above); fix that and rerun",
    ]
    assert not (repo / "ran.txt").exists(), "pytest ran after a failed set-up"
    assert (repo / "pg.txt").read_text() == "postgres-done\n", "a chain beside the failed one was not waited for"


def test_mypy_beside_the_other_checks_fails_the_checks_after_they_ran(tmp_path: Path) -> None:
    """mypy runs beside the other checks and the collection warm-up: its failure, which comes last here, still
    fails the checks chain with mypy's output, and no test runs."""
    repo = fake_project(tmp_path, "echo pytest ran > ran.txt")
    (repo / ".venv" / "bin" / "mypy").write_text("#!/bin/sh\nsleep 0.5\necho 'x.py:1: error: typed wrong'\nexit 1\n")
    (repo / ".venv" / "bin" / "lint-imports").write_text("#!/bin/sh\necho layers-checked > layers.txt\n")
    done = run_scripts_test(repo)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-2:] == [
        "x.py:1: error: typed wrong",
        "scripts/test: the set-up step 'checks' failed (its output above); fix that and rerun",
    ]
    assert (repo / "layers.txt").exists(), "the other checks did not run beside mypy"
    assert not (repo / "ran.txt").exists(), "pytest ran after mypy failed"
    assert "scripts/test: set-up step 'node_tools' done in " in done.stdout


def test_an_interrupted_set_up_leaves_no_install_running(tmp_path: Path) -> None:
    """SIGTERM (or Ctrl-C) while the set-up chains run ends every chain's processes, not only the script."""
    repo = fake_project(tmp_path, "echo pytest ran > ran.txt")
    (repo / "scripts" / "opencode-tool").write_text("#!/bin/sh\necho $$ > installer.pid\nexec sleep 120\n")
    done = subprocess.Popen(["bash", "scripts/test"], cwd=repo, env={"PATH": f"{repo / 'bin'}:/usr/bin:/bin"})
    pid_file = repo / "installer.pid"
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "the stub install never started"
        time.sleep(0.05)
    installer = int(pid_file.read_text())
    done.send_signal(signal.SIGTERM)
    assert done.wait(30) == 130
    deadline = time.monotonic() + 10
    while running(installer):
        assert time.monotonic() < deadline, "the install went on after the run was stopped"
        time.sleep(0.05)
    assert not (repo / "ran.txt").exists()


def fresh_clone(tmp_path: Path) -> Path:
    """A clone of this checkout's commit whose `.venv` is already installed, as scripts/bootstrap leaves it: the
    clone's own code first on its path, then this environment's dependencies (the pip install itself is what
    tests/test_install.py covers; here it would take minutes)."""
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(REPO), str(clone)], check=True, timeout=120)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", head.stdout.strip()], check=True, timeout=120)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(clone / ".venv")], check=True, timeout=120)
    site = Path(sysconfig.get_paths(vars={"base": str(clone / ".venv")})["purelib"])
    (site / "fresh_clone.pth").write_text(f"{clone}\n{sysconfig.get_paths()['purelib']}\n")
    python = clone / ".venv" / "bin" / "python"
    (clone / ".venv" / "bin" / "unit-mcp").write_text(
        f"#!{python}\nimport sys\nfrom unit_mcp.cli import main\nsys.exit(main())\n"
    )
    (clone / ".venv" / "bin" / "unit-mcp").chmod(0o755)
    past = (clone / "pyproject.toml").stat().st_mtime - 60
    os.utime(clone / "pyproject.toml", (past, past))
    (clone / ".venv" / ".unit-mcp-installed").touch()
    return clone


@pytest.mark.anyio
async def test_scripts_serve_on_a_fresh_clone_serves_the_example_app_by_default(
    tmp_path: Path, server_processes: list[ServerProcess]
) -> None:
    """`scripts/serve` in a fresh clone (no --app-port: it adds `--app-port 0`): it prints APP_URL beside MCP_URL,
    the example units answer there from the clone's own code, and SIGTERM ends it with exit 0."""
    clone = fresh_clone(tmp_path)
    greeter = clone / "unit_mcp" / "examples" / "units" / "greeter.py"
    greeter.write_text(greeter.read_text().replace('"Hello, ', '"Hello from the clone, '))
    run = tmp_path / "run"
    run.mkdir()
    process = ServerProcess("--no-watch", tmp=run, program=[str(clone / "scripts" / "serve")])
    server_processes.append(process)
    printed = process.ready(timeout=300)
    assert printed["APP_URL"].startswith("http://127.0.0.1:") and printed["APP_URL"].endswith("/")
    assert printed["MCP_URL"].startswith("http://127.0.0.1:")
    async with httpx.AsyncClient(base_url=printed["APP_URL"], timeout=30) as web:
        index = (await web.get("")).json()["units"]
        assert {"counter", "greeter"} <= set(index)
        assert (await web.post("counter/increment")).json() == {"count": 1}
        greeting = (await web.get("greeter/Ada")).text
    assert "Hello from the clone, Ada!" in greeting, "the clone's own example units serve"
    assert process.stop(signal.SIGTERM) == 0


FAKE_PIP_NOISE = "\n".join(f"pip says line {n}" for n in range(40))


def clone_without_venv(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A clone of this checkout's commit with no `.venv`, and a `PYTHON` for its scripts: the real interpreter,
    except that `-m pip` only logs its arguments, prints 40 lines of noise and installs the clone as
    `fresh_clone` does (the real install is what tests/test_install.py proves, from the wheel, per role)."""
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(REPO), str(clone)], check=True, timeout=120)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", head.stdout.strip()], check=True, timeout=120)
    log = tmp_path / "python-calls.log"
    site = sysconfig.get_paths(vars={"base": str(clone / ".venv")})["purelib"]
    python = tmp_path / "python3"
    python.write_text(
        f"""#!/bin/sh
echo "$*" >> {log}
if [ "$1 $2" != "-m pip" ]; then exec {sys.executable} "$@"; fi
echo "{FAKE_PIP_NOISE}"
echo "pip trouble on stderr" >&2
if [ -n "${{FAKE_PIP_FAILS:-}}" ]; then exit 1; fi
printf '%s\\n%s\\n' {clone} {sysconfig.get_paths()["purelib"]} > {site}/fresh_clone.pth
printf '#!%s\\nimport sys\\nfrom unit_mcp.cli import main\\nsys.exit(main())\\n' {clone}/.venv/bin/python \\
    > {clone}/.venv/bin/unit-mcp
chmod 755 {clone}/.venv/bin/unit-mcp
"""
    )
    python.chmod(0o755)
    return clone, log, {**os.environ, "PYTHON": str(python)}


def test_scripts_serve_on_a_fresh_clone_installs_only_the_package_quietly_and_says_what_it_serves(
    tmp_path: Path, server_processes: list[ServerProcess]
) -> None:
    """The first `scripts/serve`: one line before the install, pip's output kept back, the package alone installed
    (no extras), then the KEY=VALUE block and one line saying what is served from where and how to stop."""
    clone, log, env = clone_without_venv(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    process = ServerProcess(
        "--no-watch", "--app-port", "0", tmp=run, program=[str(clone / "scripts" / "serve")], env=env
    )
    server_processes.append(process)
    printed = process.ready(timeout=300, last="UNITS_UI_URL")
    pip_calls = [line for line in log.read_text().splitlines() if line.startswith("-m pip")]
    assert pip_calls == ["-m pip --python .venv/bin/python install --disable-pip-version-check -e ."]
    assert "-m venv --without-pip .venv" in log.read_text().splitlines()
    assert process.stop(signal.SIGTERM) == 0
    said = process.stderr().splitlines()
    base = printed["MCP_URL"].removesuffix("/mcp")
    data_dir = printed["OPENCODE_XDG_CONFIG_HOME"].removesuffix("/opencode-config")
    assert said == [
        "installing unit-mcp into .venv (about 20 s)...",
        f"unit-mcp serve: serving 4 units from a private copy of the built-in example units in {data_dir}/"
        f"example-units to MCP clients at {printed['MCP_URL']}; the page at {base}/units/ (log in with "
        f"UNITS_UI_URL: each link works once, the fresh one is in UNITS_UI_URL_FILE); the app at "
        f"{printed['APP_URL']}; Ctrl-C stops it",
    ]
    again = subprocess.run(
        [str(clone / "scripts" / "bootstrap"), "serve"], capture_output=True, text=True, env=env, timeout=300
    )
    assert (again.returncode, again.stdout, again.stderr) == (0, "", ""), "installed: a rerun installs nothing"
    assert [line for line in log.read_text().splitlines() if line.startswith("-m pip")] == pip_calls


def test_a_failed_install_shows_pips_output_and_one_line_then_stops(tmp_path: Path) -> None:
    clone, _, env = clone_without_venv(tmp_path)
    done = subprocess.run(
        [str(clone / "scripts" / "serve")],
        capture_output=True,
        text=True,
        env={**env, "FAKE_PIP_FAILS": "1"},
        timeout=300,
    )
    assert (done.returncode, done.stdout) == (1, "")
    said = done.stderr.splitlines()
    assert said[0] == "installing unit-mcp into .venv (about 20 s)..."
    assert said[-1] == (
        "scripts/bootstrap: installing unit-mcp into .venv failed (pip's output above); fix that and rerun"
    )
    assert FAKE_PIP_NOISE.splitlines() == said[1:41] and "pip trouble on stderr" in said
    assert not (clone / ".venv" / ".unit-mcp-serve-installed").exists(), "a failed install is tried again"
