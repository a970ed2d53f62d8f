"""Instructions per tool call (valgrind's callgrind), for two versions of unit_mcp side by side.

    .venv/bin/python scripts/bench_callgrind.py --base dfaf48e --against HEAD
    .venv/bin/python scripts/bench_callgrind.py --base HEAD --layer tools --calls 20 60

Instruction counts stay the same on a noisy machine (unlike seconds), so they show what a change costs per call.
Each figure runs one process under callgrind over a copy of the example units that makes N calls of one kind.

By default (`--layer service`) the calls are `UnitService` methods made inside `functools.reduce`, and callgrind
counts only what runs there (`--toggle-collect`): the calls' instructions in the calling thread, divided by N. A
write's reload runs the unit's import and init in the host's worker thread, which is not counted: that figure is
the service's own work. `--layer tools` goes through `UnitTools` and an in-memory SDK `Client` and takes the
difference of two values of N (`--calls`); its threads and event loop make that count vary with the load.

Kinds: `read` (unit_read_source), `dry_run` (unit_apply_patch dry_run of a text file), `dry_run_py` (of a Python
file), `write` (a patch that reloads, then its undo: two writes per call), `list` (unit_list). The base side
imports `unit_mcp` exported from `--base` (`--against REV`: that commit instead of the work tree). Each run is
bounded (`--timeout`); a run that passes it is reported as a miss. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KINDS = ("read", "dry_run", "dry_run_py", "write", "list")

HARNESS = r"""
import sys, shutil, tempfile, anyio
from unit_mcp import Host, UnitService, UnitTools
from unit_mcp.server import EXAMPLE_UNITS

kind, calls, layer = sys.argv[1], int(sys.argv[2]), sys.argv[3]
folder = tempfile.mkdtemp()
shutil.copytree(EXAMPLE_UNITS, folder + "/units", ignore=shutil.ignore_patterns("__pycache__"))
with open(folder + "/units/notes/README.txt", "w") as f:
    f.write("notes\nsecond line\n")
TEXT = {"unit_id": "notes", "source_id": "README.txt", "old": "second", "new": "2nd"}
STEP = {"unit_id": "counter", "source_id": "__init__.py", "old": "step = 1", "new": "step = 2"}
CALL = {
    "read": ("unit_read_source", {"unit_id": "greeter", "source_id": "greeter.py"}),
    "dry_run": ("unit_apply_patch", dict(TEXT, dry_run=True)),
    "dry_run_py": ("unit_apply_patch", dict(STEP, dry_run=True)),
    "write": ("unit_apply_patch", STEP),
    "list": ("unit_list", {}),
}
name, arguments = CALL[kind]
back = dict(arguments, old=arguments.get("new"), new=arguments.get("old"))

with Host(folder + "/units", folder + "/data") as host:
    service = UnitService(host)
    if layer == "service":  # counted only inside functools.reduce (--toggle-collect): the calls, nothing else
        import functools

        method = getattr(service, name.removeprefix("unit_"))

        def one(*_):
            method(**arguments)
            if kind == "write":
                method(**back)

        functools.reduce(one, range(calls), None)
    else:
        from mcp import Client

        async def main() -> None:
            async with Client(UnitTools(service).server()) as client:
                for _ in range(calls):
                    assert not (await client.call_tool(name, arguments)).is_error
                    if kind == "write":
                        assert not (await client.call_tool(name, back)).is_error

        anyio.run(main)
"""


def instructions(python: str, pythonpath: str, kind: str, calls: int, layer: str, timeout: float) -> int | None:
    """Instructions of one run, or None when it passed `timeout` or failed. For the service layer only those executed
    inside the loop of calls (in the calling thread) are counted."""
    counted = ["--collect-atstart=no", "--toggle-collect=functools_reduce"] if layer == "service" else []
    with tempfile.TemporaryDirectory() as out:
        command = [
            "valgrind",
            "--tool=callgrind",
            *counted,
            f"--callgrind-out-file={out}/cg.out",
            python,
            "-c",
            HARNESS,
            kind,
            str(calls),
            layer,
        ]
        env = {**os.environ, "PYTHONPATH": pythonpath, "PYTHONHASHSEED": "0"}
        try:  # run from `out`: `python -c` puts its working directory first on sys.path, which from the checkout
            # imported the work tree's unit_mcp on both sides
            run = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, env=env, check=False, cwd=out
            )
        except subprocess.TimeoutExpired:
            return None
        found = re.search(r"Collected : (\d+)", run.stderr)
        if run.returncode != 0 or found is None:
            print(run.stderr[-2000:], file=sys.stderr)
            return None
        return int(found.group(1))


def _export(commit: str, folder: str) -> None:
    """The package as it was at `commit`, in `folder`."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "unit_mcp"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="a commit to compare against this work tree")
    parser.add_argument("--against", help="a commit to measure instead of the work tree (a tree that may change)")
    parser.add_argument("--calls", type=int, nargs=2, default=(20, 60), help="the two call counts (default 20 60)")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument(
        "--layer",
        default="service",
        choices=("service", "tools"),
        help="service: UnitService methods in one thread (steady counts; default); tools: the whole tool layer over an "
        "in-memory SDK client (its worker threads and event loop make the counts vary from run to run)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take (default 900)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("bench_callgrind: valgrind is missing (Debian: apt-get install valgrind)", file=sys.stderr)
        return 1
    low, high = args.calls
    with tempfile.TemporaryDirectory() as base, tempfile.TemporaryDirectory() as against:
        _export(args.base, base)
        sides = {f"base {args.base}": base, "this tree": str(REPO)}
        if args.against:
            _export(args.against, against)
            sides = {f"base {args.base}": base, args.against: against}
        print(f"| kind | {' | '.join(sides)} | ratio |")
        print("| --- | " + " | ".join("---:" for _ in sides) + " | ---: |")
        for kind in args.kinds:
            per_call: list[float | None] = []
            for path in sides.values():
                if args.layer == "service":  # only the calls are counted: one run, divided by the calls
                    count = instructions(sys.executable, path, kind, high, args.layer, args.timeout)
                    per_call.append(None if count is None else count / high)
                    continue
                counts = [instructions(sys.executable, path, kind, n, args.layer, args.timeout) for n in (low, high)]
                per_call.append(None if None in counts else (counts[1] - counts[0]) / (high - low))  # type: ignore[operator]
            shown = [f"{p / 1e6:.2f} M" if p is not None else "miss (timeout or failure)" for p in per_call]
            ratio = f"{per_call[1] / per_call[0]:.2f}" if None not in per_call and per_call[0] else "-"
            print(f"| {kind} | {' | '.join(shown)} | {ratio} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
