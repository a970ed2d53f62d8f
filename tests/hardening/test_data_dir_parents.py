"""The folder above the data dir (security round 4, item 1): with `--data-dir /srv/team/unit-data` where a folder
above it belongs to another local user (uid 65534, `nobody`) or is writable by others, that user renames the data
dir after the start-up check and puts their own in its place, so the printed `OPENCODE_CMD` and `unit_reload` run
their code as the server's user. Every folder up to `/` must be ours or root's and not writable by group or others
unless sticky (as ssh asks of the folders above `~/.ssh`); a sticky folder like /tmp is fine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.server_process import ServerProcess

from .test_data_dir_trust import NOBODY, as_nobody, refusal, shared, units

__all__ = ["shared", "units"]  # fixtures


def test_data_dir_under_a_folder_another_user_owns_is_refused(shared: Path, units: Path) -> None:
    team = shared / "team"
    as_nobody('mkdir -m 755 "$1"', str(team))
    data = team / "unit-data"
    data.mkdir(mode=0o700)  # ours and private: only the folder above it is theirs

    # The break: the owner of the folder above swaps the whole data dir, whatever its own mode says.
    as_nobody('mv "$1" "$1.old" && mkdir -m 700 "$1" && touch "$1/planted"', str(data))
    assert (team / "unit-data" / "planted").exists(), "the swap did not happen: the attack needs it"
    as_nobody('rm -r "$1" && mv "$1.old" "$1"', str(data))

    line = refusal(units, data)
    assert line == (
        f"unit-mcp serve: error: refusing --data-dir: {team}, a folder above {data}, belongs to uid {NOBODY}, "
        f"not to you (uid {os.geteuid()}) or root, who could put a folder of their own in its place; "
        "give a data dir whose every parent folder is yours or root's"
    ), line
    assert list(data.iterdir()) == [], "the server wrote into it"


def test_data_dir_two_levels_under_another_users_folder_is_refused(shared: Path, units: Path) -> None:
    org = shared / "org"
    as_nobody('mkdir -m 755 "$1"', str(org))
    team = org / "team"
    team.mkdir(mode=0o755)  # root's: its parent is not
    data = team / "unit-data"
    line = refusal(units, data)
    assert f"refusing --data-dir: {org}, a folder above {data}, belongs to uid {NOBODY}" in line, line


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777])
def test_data_dir_under_a_folder_others_can_write_is_refused(tmp_path: Path, units: Path, mode: int) -> None:
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(mode)
    data = team / "unit-data"
    line = refusal(units, data)
    fix = f"run `chmod go-w {team}` or give" if mode == 0o775 else "give"  # not a chmod others rely on
    assert line == (
        f"unit-mcp serve: error: refusing --data-dir: {team}, a folder above {data}, is writable by group or "
        f"others (mode {mode:04o}) and not sticky, who could put a folder of their own in its place; {fix} a data "
        "dir whose every parent folder is yours or root's"
    ), line


def test_data_dir_under_a_sticky_shared_folder_is_accepted(shared: Path, tmp_path: Path) -> None:
    """The control: in a root-owned 1777 folder (like /tmp) no one else can rename what is ours."""
    data = shared / "unit-data"
    server = ServerProcess("--data-dir", str(data), "--no-watch", tmp=tmp_path)
    try:
        server.ready()
    finally:
        assert server.stop() == 0
    assert (data / "logs" / "app.log").exists()
