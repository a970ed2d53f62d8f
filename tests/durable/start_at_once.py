"""Start four `worker`s at the same moment, round after round: `python start_at_once.py FOLDER SYSTEM_DB... -- OPTIONS`.

Each round (one per SYSTEM_DB; `default` is the data dir's SQLite one) gets a fresh data dir FOLDER/round-N/data and
four forked children of this interpreter, which imported the agent command and what its worker imports once
(`support.warm_cli.WARM`: DBOS, the OpenAI client), run `unit-mcp agent worker OPTIONS --executor-id worker-K` (the
command's own `main`, each logging to FOLDER/round-N/worker-K.log); all four wait on one pipe and start within a
millisecond of each other (four separate interpreters' imports would spread the starts over seconds, and each
worker's own imports cost it about 2 s of CPU). Each must print its ready line; then all are stopped with SIGTERM.
Exit 0 when every round came up, else 1 naming the worker and its log's end."""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from pathlib import Path

from unit_mcp.cli import command_parser, main

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.warm_cli import warm_up

WORKERS = 4
READY_WITHIN = 120.0  # seconds for all four of a round

command_parser("agent")  # imports the agent command here, once before the forks, not in each worker
warm_up()  # and what a worker imports once it runs


def start_round(folder: Path, system_db: str, options: list[str]) -> str | None:
    """One round; what went wrong, or None."""
    folder.mkdir(parents=True)
    extra = [] if system_db == "default" else ["--system-db", system_db]
    read, write = os.pipe()
    children: dict[str, tuple[int, Path]] = {}
    for n in range(WORKERS):
        name, log = f"worker-{n}", folder / f"worker-{n}.log"
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # here: it exists before it is polled
        pid = os.fork()
        if pid == 0:  # the worker
            os.close(write)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.read(read, 1)
            code = 1
            try:
                data = ["--data-dir", str(folder / "data")]
                code = main(["agent", *data, "worker", *options, *extra, "--executor-id", name])
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.close(out)
        children[name] = (pid, log)
    os.close(read)
    os.write(write, b"g" * WORKERS)  # all four go
    os.close(write)
    problem = None
    deadline = time.monotonic() + READY_WITHIN
    for name, (pid, log) in children.items():
        while problem is None and f"worker {name} runs durable turns".encode() not in log.read_bytes():
            if os.waitpid(pid, os.WNOHANG)[0]:
                children[name] = (0, log)
                problem = f"{name} died: {log.read_text()[-2000:]}"
            elif time.monotonic() > deadline:
                problem = f"{name} not ready within {READY_WITHIN:g} s: {log.read_text()[-2000:]}"
            else:
                time.sleep(0.05)
    for pid, _ in children.values():
        if pid:
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
    return problem


def run(argv: list[str]) -> int:
    split = argv.index("--")
    folder, system_dbs, options = Path(argv[0]), argv[1:split], argv[split + 1 :]
    for n, system_db in enumerate(system_dbs):
        problem = start_round(folder / f"round-{n}", system_db, options)
        if problem is not None:
            print(f"round {n}: {problem}", flush=True)
            return 1
        print(f"round {n}: {WORKERS} workers up", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
