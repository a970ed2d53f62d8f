"""Source ids are handles: anything that is not a plain relative path is refused before the filesystem is touched."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unit_mcp import paths
from unit_mcp.errors import InvalidSourceId, InvalidUnitId

HOSTILE = [
    "../secret.py",
    "..",
    ".",
    "a/../../b.py",
    "/etc/passwd",
    "//etc/passwd",
    "a//b.py",
    "a/./b.py",
    "a/b/",
    "~/x.py",
    "$HOME/x.py",
    "%2e%2e/x.py",
    "..%2fx.py",
    "a\\..\\b.py",
    "C:\\win.py",
    "a\x00.py",
    "a b.py",
    "a;b.py",
    "\u2024\u2024/x.py",  # one-dot leader look-alikes
    "\uff0e\uff0e/x.py",  # full-width dots
    "a\u2215b.py",  # division slash
    ".hidden.py",
    "-rf",
    "x" * 256,
    "/".join(["a"] * 600),
    "",
]


@pytest.mark.parametrize("source_id", HOSTILE)
def test_hostile_source_ids_are_refused(source_id: str) -> None:
    with pytest.raises(InvalidSourceId):
        paths.validate_source_id(source_id)


@pytest.mark.parametrize("source_id", ["__init__.py", "pkg/mod.py", "data/cities.json", "a-b/c_d.e.py", "9.txt"])
def test_plain_source_ids_are_accepted(source_id: str) -> None:
    assert paths.validate_source_id(source_id) == tuple(source_id.split("/"))


@pytest.mark.parametrize("unit_id", ["", "1abc", "a-b", "class", "caf\u00e9", "a.b", "../x", "x" * 200])
def test_bad_unit_ids_are_refused(unit_id: str) -> None:
    with pytest.raises(InvalidUnitId):
        paths.validate_unit_id(unit_id)


@settings(max_examples=500, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(st.lists(st.sampled_from([*"ab./\\~$%\x00 _-", "\u2024", "\uff0e", "..", "/.."]), max_size=12).map("".join))
def test_a_random_source_id_resolves_inside_the_unit_root_or_is_refused(tmp_path: Path, source_id: str) -> None:
    root = tmp_path / "units"
    (root / "u").mkdir(parents=True, exist_ok=True)
    try:
        segments = paths.validate_source_id(source_id)
    except InvalidSourceId:
        return
    resolved = Path(os.path.realpath(root.joinpath("u", *segments)))
    assert resolved.is_relative_to(os.path.realpath(root / "u"))
    try:
        paths.create_bytes(root, ["u", *segments], b"x")
    except (FileExistsError, NotADirectoryError, IsADirectoryError):
        return
    assert paths.read_bytes(root, ["u", *segments]) == b"x"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "units"
    (root / "u" / "sub").mkdir(parents=True)
    (root / "u" / "__init__.py").write_text("x = 1\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.py").write_text("SECRET\n")
    return root


def test_symlinked_target_is_refused(tree: Path) -> None:
    (tree / "u" / "link.py").symlink_to(tree.parent / "outside" / "secret.py")
    with pytest.raises(paths.UnsafePath):
        paths.read_bytes(tree, ["u", "link.py"])
    with pytest.raises(paths.UnsafePath):
        paths.replace_bytes(tree, ["u", "link.py"], b"pwned")
    assert (tree.parent / "outside" / "secret.py").read_text() == "SECRET\n"


def test_symlinked_ancestor_is_refused(tree: Path) -> None:
    (tree / "u" / "lnk").symlink_to(tree.parent / "outside")
    with pytest.raises(paths.UnsafePath):
        paths.read_bytes(tree, ["u", "lnk", "secret.py"])
    with pytest.raises(paths.UnsafePath):
        paths.create_bytes(tree, ["u", "lnk", "new.py"], b"x")
    assert not (tree.parent / "outside" / "new.py").exists()


def test_fifo_is_refused_without_blocking(tree: Path) -> None:
    os.mkfifo(tree / "u" / "pipe.py")
    with pytest.raises(paths.UnsafePath):
        paths.read_bytes(tree, ["u", "pipe.py"])


def test_reads_from_a_held_root_refuse_what_reads_from_the_root_path_refuse(tree: Path) -> None:
    """A start reads every unit from one descriptor of the root (`root_fd`): a symlinked file, a symlinked folder
    and a FIFO are refused the same way, at the root's level and below; the root stays open for the next read."""
    (tree / "u" / "link.py").symlink_to(tree.parent / "outside" / "secret.py")
    (tree / "u" / "lnk").symlink_to(tree.parent / "outside")
    (tree / "top.py").symlink_to(tree.parent / "outside" / "secret.py")
    (tree / "via").symlink_to(tree.parent / "outside")
    os.mkfifo(tree / "u" / "pipe.py")
    (tree / "plain.py").write_bytes(b"x" * 200_000)  # more than one read's worth
    root_fd = paths.open_root(tree)
    try:
        for parts in (["u", "link.py"], ["u", "lnk", "secret.py"], ["top.py"], ["via", "secret.py"], ["u", "pipe.py"]):
            with pytest.raises(paths.UnsafePath):
                paths.read_bytes(tree, parts, root_fd=root_fd)
        assert paths.read_bytes(tree, ["u", "__init__.py"], root_fd=root_fd) == b"x = 1\n"
        assert paths.read_bytes(tree, ["plain.py"], root_fd=root_fd) == b"x" * 200_000
        with pytest.raises(OverflowError):
            paths.read_bytes(tree, ["plain.py"], max_bytes=1000, root_fd=root_fd)
        assert os.fstat(root_fd).st_ino == tree.stat().st_ino  # not closed by any of the reads
    finally:
        os.close(root_fd)


def test_replace_is_atomic_and_keeps_the_mode(tree: Path) -> None:
    target = tree / "u" / "__init__.py"
    target.chmod(0o640)
    paths.replace_bytes(tree, ["u", "__init__.py"], b"x = 2\n")
    assert target.read_bytes() == b"x = 2\n"
    assert target.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in (tree / "u").iterdir() if p.name.endswith(".tmp")] == []


def test_a_check_beside_the_sync_runs_before_the_replace_and_a_failing_one_writes_nothing(tree: Path) -> None:
    target = tree / "u" / "__init__.py"
    seen: list[bytes] = []
    paths.replace_bytes(tree, ["u", "__init__.py"], b"x = 2\n", alongside=lambda: seen.append(target.read_bytes()))
    assert seen == [b"x = 1\n"] and target.read_bytes() == b"x = 2\n"

    def refuse() -> None:
        raise ValueError("does not compile")

    with pytest.raises(ValueError, match="does not compile"):
        paths.replace_bytes(tree, ["u", "__init__.py"], b"x = (\n", alongside=refuse)
    assert target.read_bytes() == b"x = 2\n"
    assert [p.name for p in (tree / "u").iterdir() if p.name.endswith(".tmp")] == []


def test_a_replace_reads_the_bytes_it_replaces_in_its_own_walk_and_a_check_of_them_can_refuse(tree: Path) -> None:
    target = tree / "u" / "__init__.py"
    seen: list[bytes] = []
    assert paths.replace_bytes(tree, ["u", "__init__.py"], b"x = 2\n", check_previous=seen.append) == b"x = 1\n"
    assert seen == [b"x = 1\n"] and target.read_bytes() == b"x = 2\n"

    def stale(previous: bytes) -> None:
        raise ValueError(f"changed meanwhile: {previous!r}")

    ran: list[str] = []
    with pytest.raises(ValueError, match="x = 2"):
        paths.replace_bytes(
            tree, ["u", "__init__.py"], b"x = 3\n", check_previous=stale, alongside=lambda: ran.append("x")
        )
    assert target.read_bytes() == b"x = 2\n" and ran == []  # refused before the new bytes were written or checked
    assert [p.name for p in (tree / "u").iterdir() if p.name.endswith(".tmp")] == []


def test_work_beside_runs_in_the_caller_when_the_thread_has_not_begun_it() -> None:
    """A busy thread (or one the machine did not schedule yet) never makes its caller wait longer than the work."""
    busy, release = threading.Event(), threading.Event()

    def occupy() -> None:
        busy.set()
        release.wait(10)

    held = paths.beside(occupy)
    assert busy.wait(10)
    ran_in: list[int] = []
    paths.beside(lambda: ran_in.append(threading.get_ident()))()
    assert ran_in == [threading.get_ident()]
    release.set()
    held()
    ran_in.clear()
    finished = paths.beside(lambda: ran_in.append(threading.get_ident()))
    deadline = time.monotonic() + 5
    while not ran_in and time.monotonic() < deadline:  # the idle thread begins it
        time.sleep(0.01)
    finished()
    assert len(ran_in) == 1 and ran_in[0] != threading.get_ident()


def test_a_forked_child_gets_a_thread_beside_of_its_own() -> None:
    """The parent's thread does not exist in a child: the child starts its own instead of queueing for a dead one."""
    paths.beside(lambda: None)()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's exit code is the assertion
        ran: list[str] = []
        finished = paths.beside(lambda: ran.append(threading.current_thread().name))
        deadline = time.monotonic() + 5
        while not ran and time.monotonic() < deadline:
            time.sleep(0.01)
        finished()
        os._exit(0 if ran == ["unit-mcp-beside"] else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_create_never_overwrites_and_makes_parents(tree: Path) -> None:
    created = paths.create_bytes(tree, ["u", "a", "b", "c.py"], b"c\n")
    assert created == ["u/a", "u/a/b"]
    with pytest.raises(FileExistsError):
        paths.create_bytes(tree, ["u", "a", "b", "c.py"], b"other\n")
    assert (tree / "u" / "a" / "b" / "c.py").read_bytes() == b"c\n"
    paths.remove_file(tree, ["u", "a", "b", "c.py"])
    paths.remove_empty_dirs(tree, created)
    assert not (tree / "u" / "a").exists()


def test_the_folder_listing_finds_units_and_never_a_link_a_hidden_or_a_compiled_entry(tmp_path: Path) -> None:
    from unit_mcp.folderloader import FilesystemLoader

    root = tmp_path / "units"
    root.mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "__init__.py").write_text("")
    for name in ("plain.py", "both.py", ".hidden.py", "class.py", "not-an-id.py", "notes.txt", "x.pyc"):
        (root / name).write_text("")
    for folder in ("both", "pkg", "__pycache__", ".git", "no_init", "dir.py"):
        (root / folder).mkdir()
        if folder != "no_init":
            (root / folder / "__init__.py").write_text("")
    (root / "linked_init").mkdir()
    (root / "linked_init" / "__init__.py").symlink_to(tmp_path / "outside" / "__init__.py")
    (root / "linked_file.py").symlink_to(root / "plain.py")
    (root / "linked_unit").symlink_to(tmp_path / "outside")
    found = FilesystemLoader(root).discover()
    assert found == {"both": "directory", "pkg": "directory", "plain": "file"}
    assert list(found) == sorted(found)
