"""The watcher: armed when `start_watching()` returns, and a reload it triggers is a full transaction."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from unit_mcp import Host

# An application's own process: it imports only Host, starts watching and edits at once, EDITS times.
EDIT_RIGHT_AFTER_START = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from unit_mcp import Host

    root, data, edits = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    missed = []
    for attempt in range(edits):
        unit = root / "value.py"
        unit.write_text("VALUE = 0\\n")
        with Host(root, data) as host:
            host.start_watching(debounce_ms=20)
            unit.write_text("VALUE = 1\\n")  # right after the call returns: no pause
            deadline = time.monotonic() + 10
            while host.module("value").VALUE != 1 and time.monotonic() < deadline:
                time.sleep(0.005)
            if host.module("value").VALUE != 1:
                missed.append(attempt)
    print(f"missed {len(missed)} of {edits}: {missed}")
    """
)


def test_an_edit_made_right_after_start_watching_returns_is_reloaded(tmp_path: Path) -> None:
    """100 edits, in fresh processes importing only Host, as an application would: the first watch of a process
    is where an early "ready" showed (a warm process hid the race), so four processes make 25 edits each."""
    for process in range(4):
        root = tmp_path / f"units{process}"
        root.mkdir()
        done = subprocess.run(
            [sys.executable, "-c", EDIT_RIGHT_AFTER_START, str(root), str(tmp_path / f"data{process}"), "25"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "missed 0 of 25: []", done.stdout


def test_a_reload_on_an_edit_keeps_the_state_and_reactivates_the_activity(host: Host, units_root: Path) -> None:
    counter = host.module("counter")
    assert counter is not None
    counter.increment()
    counter.increment()
    session_before = host.activate("counter")
    host.start_watching(debounce_ms=50)
    source = units_root / "counter" / "__init__.py"
    source.write_text(source.read_text().replace("step = 1", "step = 5"))

    deadline = time.monotonic() + 10
    while host.module("counter") is counter and time.monotonic() < deadline:
        time.sleep(0.02)
    reloaded = host.module("counter")
    assert reloaded is not counter, "the edit on disk was not reloaded"
    assert reloaded.count == 2, "snapshot/restore carried the count across the reload"
    assert reloaded.increment() == 7, "the new code runs"
    assert host.active_activity == "counter", "the activity that was active is active again"
    assert host.active_session is not None and host.active_session is not session_before
    assert "unit counter reloaded after a change in the store" in host.log_path.read_text()
