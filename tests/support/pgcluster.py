"""A throwaway PostgreSQL 15 cluster on a free loopback port, for the Postgres loader's tests.

initdb refuses root: when the tests run as root the cluster runs as `nobody` (its folder owned by it). The
password is a random one, given to initdb in a file and to clients in a PGPASSFILE: never on a command line.
"""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

BINDIR = Path("/usr/lib/postgresql/15/bin")
NOBODY = 65534


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Cluster:
    def __init__(self) -> None:
        if not (BINDIR / "initdb").is_file():
            raise RuntimeError(f"PostgreSQL 15 is missing ({BINDIR}/initdb): run scripts/postgres-tool")
        self.user = NOBODY if os.geteuid() == 0 else None
        self.root = Path(tempfile.mkdtemp(prefix="unit-mcp-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.password = secrets.token_hex(16)
        self.port = 0
        self._names = itertools.count(1)
        self.passfile = Path(tempfile.mkstemp(prefix="unit-mcp-pgpass-")[1])  # ours (root), mode 0600
        if self.user is not None:
            os.chown(self.root, self.user, -1)
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        if self.user is not None:
            os.chown(pwfile, self.user, -1)
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "-A", "scram-sha-256", f"--pwfile={pwfile}",
            "--no-sync", "-E", "UTF8", "--locale=C",
        )  # fmt: skip
        pwfile.unlink()

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run(
            [str(BINDIR / tool), *args], user=self.user, cwd=self.root, capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"{tool} {' '.join(args)} failed: {done.stdout}{done.stderr}{log[-2000:]}")

    def start(self) -> None:
        """Start on a free port, or on the same port again after `stop`."""
        for _ in range(1 if self.port else 5):  # a free port can be taken between the probe and the start
            self.port = self.port or free_port()
            options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300"
            try:
                self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-o", options, "-l", str(self.log), "start")
                break
            except RuntimeError:
                if "could not bind" not in (self.log.read_text() if self.log.exists() else ""):
                    raise
        self.passfile.write_text(f"127.0.0.1:{self.port}:*:postgres:{self.password}\n")
        os.chmod(self.passfile, 0o600)

    def restart(self) -> None:
        """A real outage: every connection dropped, the server down for the restart."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", "fast", "-l", str(self.log), "restart")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", "fast", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A new empty database; its address (the password comes from PGPASSFILE)."""
        import psycopg

        name = f"units_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            self.passfile.unlink(missing_ok=True)
