"""The app log reader: absolute line numbers through the rotated files, newest-first and forward reading,
checked against a plain enumeration of the files for any contents (Hypothesis)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from unit_mcp import applog

# Lines: empty ones, CRLF, non-ASCII; a file may end without a newline (a record being written).
line = st.text(alphabet=st.sampled_from("ab é\r"), max_size=12)
log_file = st.tuples(st.lists(line, max_size=8), st.booleans()).map(
    lambda spec: ("\n".join(spec[0]) + ("\n" if spec[1] and spec[0] else "")).encode()
)


def expected(contents: list[bytes]) -> tuple[list[tuple[int, str]], int]:
    """Every non-empty line with its number, oldest file first, by plain enumeration; and the line count."""
    numbered: list[tuple[int, str]] = []
    base = 0
    for data in contents:
        pieces = data.split(b"\n")
        for index, piece in enumerate(pieces):
            if piece:
                numbered.append((base + index + 1, piece.decode().rstrip("\r")))
        base += len(pieces) - 1 + (not data.endswith(b"\n") and data != b"")
    return numbered, base


@settings(max_examples=150, deadline=None)
@given(
    contents=st.lists(log_file, min_size=1, max_size=4),
    grep=st.sampled_from([None, "a", "é"]),
    count=st.integers(1, 6),
    position=st.integers(1, 40),
    block=st.sampled_from([3, 7, 64 * 1024]),
)
def test_numbers_and_pages_match_a_plain_enumeration(
    contents: list[bytes], grep: str | None, count: int, position: int, block: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(applog, "BLOCK", block):
        live = Path(tmp) / "app.log"
        files = applog.log_files(live, len(contents) - 1)  # newest first
        for path, data in zip(reversed(files), contents, strict=True):  # contents are oldest first
            path.write_bytes(data)
        numbered, total = expected(contents)
        matching = [(n, text) for n, text in numbered if grep is None or grep in text]

        newest = applog.newest(files, grep=grep, count=count)
        assert (newest.lines, newest.has_more, newest.total) == (matching[-count:], len(matching) > count, total)

        older = [(n, text) for n, text in matching if n < position]
        back = applog.newest(files, grep=grep, count=count, before=position)
        assert (back.lines, back.has_more) == (older[-count:], len(older) > count)

        later = [(n, text) for n, text in matching if n >= position]
        ahead = applog.forward(files, grep=grep, count=count, start=position)
        assert (ahead.lines, ahead.has_more, ahead.total) == (later[:count], len(later) > count, total)


def test_appended_lines_are_counted_incrementally_and_a_new_file_afresh(tmp_path: Path) -> None:
    live = tmp_path / "app.log"
    files = applog.log_files(live, 1)
    live.write_bytes(b"one\ntwo\n")
    assert applog.newest(files, grep=None, count=5).lines == [(1, "one"), (2, "two")]
    with live.open("ab") as out:
        out.write(b"three\n")
    assert applog.newest(files, grep=None, count=1).lines == [(3, "three")]
    live.rename(files[1])  # a rotation: the live file becomes the backup, a new live file starts
    live.write_bytes(b"four\n")
    page = applog.forward(files, grep=None, count=10, start=2)
    assert page.lines == [(2, "two"), (3, "three"), (4, "four")] and page.total == 4


def test_the_handler_writes_every_record_whole_and_rolls_over_at_its_size(tmp_path: Path) -> None:
    """One line a record, a text no encoder takes (a lone surrogate) escaped rather than lost, the time stamp
    the stock formatter gives, and a rollover once the file has reached max_bytes."""
    import logging

    live = tmp_path / "logs" / "app.log"
    handler = applog.open_app_log(live, max_bytes=2000, backups=1)
    stock = logging.Formatter(applog.LOG_FORMAT)
    log = logging.getLogger("units.applog_test")
    try:
        log.info("first %s", "line")
        # Straight to the handler: pytest's own handlers (and xdist's channel to its workers) cannot encode it.
        handler.handle(log.makeRecord(log.name, logging.WARNING, "f", 1, "odd \udcff text", None, None))
        lines = live.read_text().splitlines()
        assert lines[0].endswith(" INFO units.applog_test: first line")
        assert lines[1].endswith(" WARNING units.applog_test: odd \\udcff text")
        record = log.makeRecord(log.name, logging.INFO, "f", 1, "m", None, None)
        for created in (1765151999.9991, 1765152000.0, record.created):
            record.created, record.msecs = created, (created - int(created)) * 1000
            assert handler.format(record) == stock.format(record)
        for n in range(60):
            log.info("filler %02d %s", n, "x" * 40)
        backup = live.with_name("app.log.1")
        assert backup.exists() and live.stat().st_size < 2000 + 100 and backup.stat().st_size >= 2000
        kept = backup.read_text().splitlines() + live.read_text().splitlines()
        fillers = [line.split("filler ")[1][:2] for line in kept if "filler" in line]
        assert fillers == sorted(fillers) and fillers[-1] == "59"
    finally:
        applog.close_app_log(handler)
