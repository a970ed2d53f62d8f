"""A data dir is trusted only when it is ours: another local user (uid 65534, `nobody`) pre-creates the server's
`--data-dir` in a shared 1777 folder with planted bytecode or a log symlink, and the server refuses it in one
line before it runs or appends to anything; so is a data dir (or a folder in it) that is a symlink, another
user's or group/world-writable. What a fresh server creates is private: folders 0700, files 0600."""

from __future__ import annotations

import importlib.util
import marshal
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.server_process import ServerProcess

from unit_mcp import Host
from unit_mcp.server import EXAMPLE_UNITS

NOBODY = 65534


@pytest.fixture
def shared() -> Iterator[Path]:
    """A world-writable sticky folder every local user can reach, like /tmp (pytest's tmp_path is 0700)."""
    base = Path(tempfile.gettempdir())
    assert base.stat().st_mode & 0o001, f"{base} cannot be entered by another user: the attack needs a shared folder"
    folder = Path(tempfile.mkdtemp(prefix="unit-mcp-shared-", dir=base))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder)


def as_nobody(script: str, *args: str, data: bytes = b"") -> None:
    """Run a shell script as the unprivileged user (its own uid, gid and no supplementary groups)."""
    done = subprocess.run(
        ["/bin/sh", "-ec", script, "sh", *args],
        input=data,
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()


@pytest.fixture
def units(tmp_path: Path) -> Path:
    folder = tmp_path / "units"
    shutil.copytree(EXAMPLE_UNITS, folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def refusal(units: Path, data_dir: Path) -> str:
    """The server's one stderr line when it refuses `data_dir` (exit 1); it must not start serving."""
    done = subprocess.run(
        [sys.executable, "-m", "unit_mcp.server", "--units", str(units), "--data-dir", str(data_dir), "--no-watch"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and done.stdout == "", (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("unit-mcp serve: error: refusing --data-dir"), lines[0]
    return lines[0]


def planted_bytecode(units: Path, tmp_path: Path, marker: Path) -> bytes:
    """A bytecode cache whose every entry writes `marker`: keyed like the real one (module origin, source hash),
    which another user can compute from sources they can read; here taken from a real start's cache."""
    honest = tmp_path / "honest"
    Host(units, honest).start().close()
    entries = marshal.loads((honest / "bytecode" / "units").read_bytes()[len(importlib.util.MAGIC_NUMBER) :])
    payload = f"open({str(marker)!r}, 'w').write('planted code ran')"
    planted = {key: marshal.dumps(compile(payload, key[0], "exec")) for key in entries}  # each entry marshalled
    assert planted, "the honest start cached no unit: nothing to plant"
    return importlib.util.MAGIC_NUMBER + marshal.dumps(planted)


def test_data_dir_precreated_by_another_user_is_refused(shared: Path, units: Path, tmp_path: Path) -> None:
    marker = tmp_path / "planted-code-ran"
    blob = planted_bytecode(units, tmp_path, marker)

    # Control: in a data dir of ours, the same cache is used, so the plant is a real one.
    ours = tmp_path / "ours"
    (ours / "bytecode").mkdir(parents=True, mode=0o700)
    (ours / "bytecode" / "units").write_bytes(blob)
    Host(units, ours).start().close()
    assert marker.read_text() == "planted code ran"
    marker.unlink()

    # The attack: nobody pre-creates the data dir with that cache, and a swapped OpenCode launcher.
    data = shared / "data"
    as_nobody(
        'mkdir -p "$1/bytecode" "$1/clients" && cat > "$1/bytecode/units" '
        '&& printf "#!/bin/sh\\ntouch %s\\n" "$2" > "$1/clients/opencode" && chmod 755 "$1/clients/opencode"',
        str(data),
        str(marker),
        data=blob,
    )
    line = refusal(units, data)
    assert line == (
        f"unit-mcp serve: error: refusing --data-dir: {data} belongs to uid {NOBODY}, not to you (uid {os.geteuid()}), "
        "who could have planted files in it; give a private folder of your own instead (`mktemp -d` makes one; "
        "or ~/.local/share/unit-mcp)"
    )
    assert not marker.exists(), "the planted bytecode ran"
    assert (data / "clients" / "opencode").read_text().startswith("#!/bin/sh"), "the plant was left alone"


def _world_writable(data: Path) -> Path:
    data.mkdir(mode=0o700)
    data.chmod(0o777)
    return data


def _group_writable(data: Path) -> Path:
    data.mkdir(mode=0o700)
    data.chmod(0o770)
    return data


def _writable_logs(data: Path) -> Path:
    (data / "logs").mkdir(parents=True, mode=0o700)
    (data / "logs").chmod(0o757)
    return data / "logs"


def _foreign_clients(data: Path) -> Path:
    (data / "clients").mkdir(parents=True, mode=0o700)
    os.chown(data / "clients", NOBODY, NOBODY)
    return data / "clients"


def _symlinked_data_dir(data: Path) -> Path:
    real = data.with_name("real-data")
    real.mkdir(mode=0o700)
    data.symlink_to(real)
    return data


def _symlinked_bytecode(data: Path) -> Path:
    elsewhere = data.with_name("elsewhere")
    elsewhere.mkdir(mode=0o700)
    data.mkdir(mode=0o700)
    (data / "bytecode").symlink_to(elsewhere)
    return data / "bytecode"


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (_world_writable, "is writable by group or others (mode 0777)"),
        (_group_writable, "is writable by group or others (mode 0770)"),
        (_writable_logs, "is writable by group or others (mode 0757)"),
        (_foreign_clients, f"belongs to uid {NOBODY}, not to you"),
        (_symlinked_data_dir, "is a symbolic link; give the real folder"),
        (_symlinked_bytecode, "is a symbolic link; give the real folder"),
    ],
)
def test_group_or_world_writable_data_dir_is_refused(
    units: Path, tmp_path: Path, make: Callable[[Path], Path], problem: str
) -> None:
    data = tmp_path / "data"
    culprit = make(data)
    line = refusal(units, data)
    assert f"refusing --data-dir: {culprit} {problem}" in line, line
    assert not (data / "logs" / "app.log").exists() and not (data / "clients" / "claude-mcp.json").exists()


def test_log_symlink_planted_in_data_dir_is_not_followed(shared: Path, units: Path, tmp_path: Path) -> None:
    target = tmp_path / "root-only"
    target.write_text("root's own file\n")
    target.chmod(0o600)

    # Planted by another user in a data dir of theirs: the whole folder is refused.
    theirs = shared / "data"
    as_nobody('mkdir -p "$1/logs" && ln -s "$2" "$1/logs/app.log"', str(theirs), str(target))
    assert f"{theirs} belongs to uid {NOBODY}" in refusal(units, theirs)

    # Standing in a data dir of ours (left from when it was shared): the server never opens it.
    ours = tmp_path / "data"
    (ours / "logs").mkdir(parents=True, mode=0o700)
    (ours / "logs" / "app.log").symlink_to(target)
    line = refusal(units, ours)
    assert line == f"unit-mcp serve: error: refusing --data-dir {ours}: app.log is a symbolic link in it; remove it"

    assert target.read_text() == "root's own file\n", "the server appended to the symlink's target"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_a_fresh_server_creates_only_private_folders_and_files(tmp_path: Path) -> None:
    data = tmp_path / "new" / "data"
    server = ServerProcess("--data-dir", str(data), "--env-file", str(tmp_path / "env"), tmp=tmp_path)
    try:
        server.ready()
    finally:
        assert server.stop() == 0
    assert (data / "logs" / "app.log").stat().st_size > 0, "the server logged nothing"
    found = [data.parent, data, *data.rglob("*"), tmp_path / "env"]
    kinds = {"folder": 0, "file": 0}
    for path in found:
        status = path.lstat()
        assert not stat.S_ISLNK(status.st_mode), path
        assert status.st_uid == os.geteuid(), path
        assert stat.S_IMODE(status.st_mode) & 0o077 == 0, f"{path} is {stat.S_IMODE(status.st_mode):04o}"
        kinds["folder" if stat.S_ISDIR(status.st_mode) else "file"] += 1
    for name in ("logs/app.log", "bytecode/units", "clients/claude-mcp.json", "opencode-config/opencode"):
        assert (data / name).exists(), name
    assert kinds["folder"] >= 8 and kinds["file"] >= 10, kinds


def test_agent_store_precreated_by_another_user_is_refused(shared: Path) -> None:
    """The agent runner's data dir holds the approvals a turn resumes from: nobody's pre-created one is refused."""
    store = shared / "agent-sessions"
    as_nobody('mkdir -p "$1"', str(store))
    for command in (["sessions", "list"], ["run", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "hi"]):
        done = subprocess.run(
            [sys.executable, "-m", "unit_mcp.agent", "--data-dir", str(store), *command],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout, done.stderr)
        assert done.stderr == (
            f"unit-mcp agent: error: refusing the session store: {store} belongs to uid {NOBODY}, not to you "
            f"(uid {os.geteuid()}), "
            "who could have planted files in it; give a private folder of your own instead (`mktemp -d` makes one; "
            "or ~/.local/share/unit-mcp)\n"
        )
        assert list(store.iterdir()) == [], "the agent wrote into it"


def test_the_system_temporary_folder_as_data_dir_is_refused_with_a_private_folder_to_give(units: Path) -> None:
    """A folder every user shares is never to be chmod-ed (that would break every other user of it): the hint is a
    private folder of one's own, and the shared folder keeps its mode."""
    system_tmp = Path(tempfile.gettempdir())
    before = system_tmp.stat().st_mode
    line = refusal(units, system_tmp)
    assert "chmod" not in line and "remove it" not in line, line
    hint = "give a private folder of your own instead (`mktemp -d` makes one; or ~/.local/share/unit-mcp)"
    assert line.endswith(hint), line
    assert system_tmp.stat().st_mode == before


def test_a_file_given_as_data_dir_is_refused_with_what_to_give_instead(units: Path, tmp_path: Path) -> None:
    given = tmp_path / "notes.txt"
    given.write_text("mine\n")
    line = refusal(units, given)
    assert line == (
        f"unit-mcp serve: error: refusing --data-dir: {given} is a file, not a folder; give a folder instead (a path "
        f"that does not exist yet is created as a private folder, e.g. {given}.d)"
    ), line
    assert given.read_text() == "mine\n"
