"""A process writing sources through the service is killed with SIGKILL at random moments:
every source is always byte-for-byte one of the versions that were written, never a mix."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

from support.warm_cli import warm_cli

WRITER = r"""
import sys
from unit_mcp import Host, UnitService

units, data = sys.argv[1], sys.argv[2]
with Host(units, data) as host:
    service = UnitService(host)
    print("ready", flush=True)
    n = 0
    while True:
        current = service.read_source("bulk", "table.py").content
        marker = "VERSION = 'a'" if "VERSION = 'a'" in current else "VERSION = 'b'"
        flipped = "VERSION = 'b'" if marker.endswith("'a'") else "VERSION = 'a'"
        service.apply_patch("bulk", "table.py", old=marker, new=flipped)
        n += 1
        print("wrote", flush=True)
"""


def versions(body: str) -> tuple[bytes, bytes]:
    return (f"VERSION = 'a'\n{body}".encode(), f"VERSION = 'b'\n{body}".encode())


def test_sigkill_during_writes_never_leaves_a_torn_source(tmp_path: Path) -> None:
    units = tmp_path / "units"
    (units / "bulk").mkdir(parents=True)
    (units / "bulk" / "__init__.py").write_text("from . import table\n")
    body = "".join(
        f"ROW_{n} = {n!r}  # a line of padding so that the write takes a while ......\n" for n in range(4000)
    )
    allowed = versions(body)
    target = units / "bulk" / "table.py"
    target.write_bytes(allowed[0])
    rng = random.Random(7)
    script = tmp_path / "writer.py"  # each writer a fork of the warm interpreter: unit_mcp's imports made once
    script.write_text(WRITER)
    written = changed = 0
    previous = target.read_bytes()
    for kills in range(1, 26):
        writer = warm_cli().popen([str(units), str(tmp_path / "data")], env=os.environ, cwd=tmp_path, script=script)
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        if kills % 5 == 0:  # every fifth writer is killed after a whole write, however slow the machine
            assert writer.stdout.readline().strip() == "wrote"
            written += 1
        time.sleep(rng.uniform(0.0, 0.25))
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        written += writer.stdout.read().count("wrote")
        now = target.read_bytes()
        assert now in allowed, f"torn write after kill {kills}: {len(now)} bytes"
        changed += now != previous
        previous = now
    # killed between writes as well as during them: whole writes happened (and changed the file) before kills
    assert written >= 5 and changed >= 1, (written, changed)
    leftovers = [p.name for p in (units / "bulk").iterdir() if p.name.startswith(".")]
    assert all(name.endswith(".tmp") for name in leftovers)
