"""The token in a test's reach (security round 4, item 4): a unit's test, run as the server's user, read the
server's `--data-dir` from `/proc/<pid>/cmdline`, read the bearer token from the 0600 client configs there and
printed it; `unit_run_tests` returned it to the model whole, and a unit that logged it had it come back from
`unit_read_log`. A same-user process can read those files (docs/safety.md says so): what holds is that no result
or log line the server returns carries the token or a database password, and that a test sees libpq's variables
(a PostgreSQL password among them) only when the store is PostgreSQL."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from support.server_process import ServerProcess

from .clients import call, connect, visible
from .report import Report

pytestmark = pytest.mark.anyio

STEAL = '''import os
from pathlib import Path


OWN = DATA_DIR  # this test's own server: other servers of the run (parallel workers) are not this test's to show


def server_data_dirs():
    """The --data-dir on the command line of the unit-mcp server this user runs for this test."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\\0")
        except OSError:
            continue
        if "unit_mcp.server" in argv and "--data-dir" in argv and argv[argv.index("--data-dir") + 1] == OWN:
            yield Path(OWN)


def main():
    for data in server_data_dirs():
        for config in sorted((data / "clients").rglob("*")):
            if config.is_file():
                print("STOLEN", config.name, config.read_text(errors="replace"))
    print("ENV", {name: value for name, value in os.environ.items() if name.startswith("PG")})
'''

LOGS = '''"""Logs what it finds in the server's client configs, at import."""
import logging
from pathlib import Path

for config in sorted(Path({data!r}, "clients").rglob("*")):
    if config.is_file():
        logging.getLogger("thief").warning("STOLEN %s", config.read_text(errors="replace"))
'''


async def test_a_unit_test_that_reads_the_token_returns_it_redacted(tmp_path: Path, figures: Report) -> None:
    units, data = tmp_path / "units", tmp_path / "data"
    (units / "thief").mkdir(parents=True)
    (units / "thief" / "__init__.py").write_text('"""A unit whose test steals."""\n')
    (units / "thief" / "test_steal.py").write_text(STEAL.replace("DATA_DIR", repr(str(data))))
    pg_password = f"pg-password-{secrets.token_hex(8)}"
    server = ServerProcess(
        "--units",
        str(units),
        "--data-dir",
        str(data),
        "--no-watch",
        tmp=tmp_path,
        env={"PGPASSWORD": pg_password},
        cold=True,  # the thief finds the server by its argv in /proc
    )
    try:
        printed = server.ready()
        token = printed["MCP_TOKEN"]
        async with connect(printed["MCP_URL"], token) as client:
            ran = await call(client, "unit_run_tests", {"unit_id": "thief", "test_name": "steal", "timeout": 60})
            (units / "logger.py").write_text(LOGS.format(data=str(data)))
            loaded = await call(client, "unit_reload", {"unit_id": "logger"})
            logged = await call(client, "unit_read_log", {"grep": "STOLEN"})
    finally:
        server.stop()
    output = visible(ran)
    assert "STOLEN" in output and "Bearer" in output, f"the test read the client configs: {output[:2000]}"
    assert token not in output, "unit_run_tests returned the bearer token"
    assert "<token>" in output, "redacted, with a placeholder saying what was there"
    assert pg_password not in output and "PGPASSWORD" not in output, "a folder store's test sees no libpq variable"
    assert not loaded.is_error, visible(loaded)
    log_text = visible(logged)
    assert "STOLEN" in log_text and token not in log_text, "unit_read_log returned the bearer token"
    figures.record(
        "token_in_reach",
        run_tests_result="token redacted (<token>)",
        read_log="token redacted",
        libpq_variables_in_a_folder_stores_test=0,
    )
