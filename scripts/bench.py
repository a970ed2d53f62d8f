"""Benchmarks measured side by side in one run: medians, p95 and the ratios that matter.

    .venv/bin/python scripts/bench.py            # everything (about a minute), writes bench/RESULTS.md and results.json
    .venv/bin/python scripts/bench.py --quick    # fewer rounds and smaller scale, for a smoke run
    .venv/bin/python scripts/bench.py --only transport,reload
    .venv/bin/python scripts/bench.py --only changelog --merge   # fold one section into the written report
    .venv/bin/python scripts/bench.py --only idle --merge        # opt-in: a server of 10,000 units idle for 60 s
    .venv/bin/python scripts/bench.py --only live --merge        # opt-in: a live app changed under load, vs peers
    .venv/bin/python scripts/bench.py --only startup --merge     # opt-in: stdio initialize; scripts/serve on a clone

Quick and partial runs print their figures and leave bench/ alone (--write replaces the report anyway).

The machine is shared and noisy: the two sides of every ratio are interleaved call by call in the same
run, so drift hits both alike. Absolute times are context only. Nothing here is asserted; a figure that
misses its goal is marked in the report; why, goes under its "## Notes kept by hand" (kept when it is rewritten).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import resource
import select
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any
from unittest.mock import patch
from urllib.parse import urlsplit

import anyio
import mcp_types as types
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types.version import LATEST_HANDSHAKE_VERSION

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from support.load_mix import cpu_seconds, rss_kib  # noqa: E402

from unit_mcp import Host, UnitService  # noqa: E402
from unit_mcp.bridge import Bridge  # noqa: E402
from unit_mcp.changelog import NOBODY, Retention, SourceChange, SqliteChangeLog  # noqa: E402
from unit_mcp.errors import UnitError  # noqa: E402
from unit_mcp.loader import Source  # noqa: E402
from unit_mcp.proctree import descendants  # noqa: E402
from unit_mcp.tools import UnitTools  # noqa: E402

FS_SERVER = "@modelcontextprotocol/server-filesystem@2026.8.31"
BENCH_TOOLS = REPO / ".cache" / "bench-tools"
OUT = REPO / "bench"
CLIENT_TOKEN = "UNIT_MCP_BENCH_TOKEN"  # the bearer token for `--client` processes
SECTIONS = (
    "transport",
    "write_floor",
    "served",
    "saturation",
    "filesystem",
    "reload",
    "scale",
    "loaders",
    "replicas",
    "log",
    "changelog",
    "checkpoints",
    "sessions",
    "concurrency",
    "tests",
    "durable",
    "resolve",
    "edits",
    "otel",
)
OPT_IN = ("idle", "live", "startup")
"""Sections that run only when named in --only (the idle one waits a minute, live about four, startup installs a
fresh clone: a minute or two)."""
SECTION_SECONDS = 900.0
"""Each section's own time bound (--section-seconds): one that has not ended by then is stopped and reported as a
miss ("hang"), and the run goes on with the next section."""
CALL = "UNIT_MCP_BENCH_CALL"  # the tool and arguments a `--client` process calls, as JSON
READ_20KB = ["unit_read_source", {"unit_id": "big", "source_id": "__init__.py"}]
WATCH_HOST = """
import importlib, sys
import watchfiles
sys.dont_write_bytecode = True  # a same-size edit in the same second as the cached .pyc would be read stale
sys.path.insert(0, sys.argv[1])
import big
print(big.VALUE_0001, flush=True)
for _ in watchfiles.watch(sys.argv[1]):
    importlib.reload(big)
    print(big.VALUE_0001, flush=True)
"""
"""A host that serves a module and reloads it on its file watcher, saying which VALUE_0001 it serves now. It writes
no bytecode: `importlib.reload` trusts a `.pyc` whose recorded source mtime (whole seconds) and size match, so an
edit to 10 from 11 in the second that cached 11 would keep serving 11 and the section would wait forever."""


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"median_ms": round(statistics.median(ordered), 4), "p95_ms": round(p95, 4), "n": len(ordered)}


async def interleaved(
    sides: dict[str, Callable[[], Awaitable[Any]]], rounds: int, warmup: int = 5
) -> dict[str, list[float]]:
    """Call each side once per round, in turn, and keep each call's wall time in milliseconds."""
    for _ in range(warmup):
        for fn in sides.values():
            await fn()
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            started = time.perf_counter()
            await fn()
            samples[name].append((time.perf_counter() - started) * 1000)
    return samples


async def direct(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def ratio_row(
    name: str, numerator: dict[str, float], denominator: dict[str, float], goal: float | None
) -> dict[str, Any]:
    value = numerator["median_ms"] / denominator["median_ms"] if denominator["median_ms"] else float("inf")
    row: dict[str, Any] = {"ratio": name, "value": round(value, 3)}
    if goal is not None:
        row["goal"] = f"<= {goal}"
        row["met"] = value <= goal
    return row


def start_row(count: int, milliseconds: float, which: str = "start") -> dict[str, Any]:
    """Host start-up is an absolute figure, in seconds; its goal (1 s) is for 10,000 units."""
    row: dict[str, Any] = {"ratio": f"host {which}, {count} units (seconds)", "value": round(milliseconds / 1000, 3)}
    if count == 10_000:
        row["goal"] = "<= 1.0"
        row["met"] = row["value"] <= 1.0
    return row


BARE_IMPORT = """
import gc, importlib, sys, time
sys.path.insert(0, sys.argv[1])
gc.disable()  # as the host's start does
started = time.perf_counter()
for n in range(int(sys.argv[2])):
    importlib.import_module(f"unit_{n:05d}")
print((time.perf_counter() - started) * 1000)
"""
"""Python's own import of the `make_units` modules from sys.path, timed inside a fresh interpreter (its start-up left
out); run with `-X pycache_prefix` so the units root gets no __pycache__ folder."""


def bare_row(count: int, figures: dict[str, Any], which: str) -> dict[str, Any]:
    """The host's start against Python's own import of the same units: no goal, but unlike the seconds it stays
    about the same from one machine to another."""
    ratio = figures[f"host_{which}_{count}_units_ms"] / figures[f"bare_import_{count}_units_ms"]
    return {
        "ratio": f"host {which} / bare Python import of the same {count} units (from sys.path, .pyc present, a fresh "
        "interpreter; context)",
        "value": round(ratio, 3),
    }


async def bare_import_ms(root: Path, count: int, pycache: Path) -> float:
    command = [sys.executable, "-X", f"pycache_prefix={pycache}", "-c", BARE_IMPORT, str(root), str(count)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # the first run writes the .pyc
    return float((await anyio.run_process(command, env=env)).stdout.decode().strip())


def sqlite_bytes(path: Path) -> int:
    """A SQLite database's size once its write-ahead log is folded in (pages in use and free)."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
        return pages * int(conn.execute("PRAGMA page_size").fetchone()[0])
    finally:
        conn.close()


def durable_write(path: Path, data: bytes) -> None:
    """Bytes written as an editor that cares writes them: a temporary file beside, fsync, rename over."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def make_units(root: Path, count: int, *, body: str = "") -> None:
    root.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        (root / f"unit_{n:05d}.py").write_text(f'"""Unit number {n}: tracks widget {n % 97} totals."""\n{body}')


def twenty_kb_unit(root: Path) -> None:
    folder = root / "big"
    folder.mkdir(parents=True)
    lines = [f"VALUE_{n:04d} = {n}  # padding to make a twenty kilobyte source file ......\n" for n in range(280)]
    (folder / "__init__.py").write_text('"""A 20 KB unit."""\n' + "".join(lines))


def ten_module_unit(folder: Path) -> None:
    """A package of ten modules (`__init__` imports nine of 40 functions each): what a patch reloads in full."""
    folder.mkdir(parents=True)
    imports = "".join(f"from . import mod{n}\n" for n in range(9))
    (folder / "__init__.py").write_text(f'"""Ten modules."""\n{imports}VERSION = 0\n')
    for n in range(9):
        (folder / f"mod{n}.py").write_text("".join(f"def f{k}(x):\n    return x * {k} + {n}\n\n" for k in range(40)))


@asynccontextmanager
async def http_client(url: str, token: str | None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        create_mcp_http_client(headers=headers) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):
        yield client


def read_ready_lines(server: subprocess.Popen[str]) -> dict[str, str]:
    """The `KEY=value` lines a `unit_mcp.server` prints once it listens (up to its MCP_TOKEN line)."""
    printed: dict[str, str] = {}
    assert server.stdout is not None
    while "MCP_TOKEN" not in printed:
        line = server.stdout.readline()
        if not line:
            raise RuntimeError("a unit_mcp.server exited before it listened")
        key, _, value = line.rstrip("\n").partition("=")
        printed[key] = value
    return printed


def initialize_answered(command: list[str], timeout: float = 120.0) -> tuple[float, float]:
    """Start `command` (an MCP server on stdio), send `initialize` at once and read its answer: the wall time from
    exec to the answer and the server's CPU time by then, in milliseconds. The server is ended after."""
    client = {"name": "bench", "version": "0"}
    params = {"protocolVersion": LATEST_HANDSHAKE_VERSION, "capabilities": {}, "clientInfo": client}
    hello = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}
    started = time.perf_counter()
    server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(json.dumps(hello).encode() + b"\n")
        server.stdin.flush()
        deadline = started + timeout
        answer = b""
        while not answer.endswith(b"\n"):
            if not select.select([server.stdout], [], [], max(0.0, deadline - time.perf_counter()))[0]:
                raise RuntimeError(f"{command[:3]} did not answer initialize within {timeout:g} s")
            chunk = os.read(server.stdout.fileno(), 1 << 16)
            if not chunk:
                raise RuntimeError(f"{command[:3]} exited before it answered initialize")
            answer += chunk
        wall = (time.perf_counter() - started) * 1000
        used = cpu_seconds(server.pid) * 1000
        if b'"result"' not in answer:
            raise RuntimeError(f"{command[:3]} answered initialize with {answer[:200]!r}")
        return wall, used
    finally:
        server.kill()
        server.wait(30)


def scripts_serve_ready(clone: Path, env: dict[str, str]) -> tuple[float, float]:
    """Seconds from running `scripts/serve --no-watch` in `clone` (cloned from this checkout's HEAD first, if it is
    not there) to its ready lines, and the CPU seconds of everything it ran (the install too: `scripts/serve` waits
    for it, then becomes the server); the server is stopped after."""
    if not clone.exists():
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=300)
    keep = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    ready = None
    server = subprocess.Popen(
        [str(clone / "scripts" / "serve"), "--no-watch", "--data-dir", str(clone.parent / f"{clone.name}-data")],
        cwd=clone, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**keep, **env},
    )  # fmt: skip
    try:
        assert server.stdout is not None
        for line in server.stdout:
            if line.startswith("XDG_CONFIG_HOME="):
                ready = time.perf_counter() - started
                break
        else:
            raise RuntimeError(f"scripts/serve in {clone} exited before its ready lines")
    finally:
        server.terminate()
        server.wait(30)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ready, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def bare_server() -> Server[Any]:
    """The transport floor: a server whose one tool does nothing."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="noop", input_schema={"type": "object"})])

    async def call_tool(ctx: Any, params: Any) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text="ok")])

    return Server("bare", on_list_tools=list_tools, on_call_tool=call_tool)


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.quick = args.quick
        self.rounds = 40 if args.quick else 300
        self.results: dict[str, Any] = {"sections": {}, "ratios": []}
        self._cluster: Any = None

    def cluster(self) -> Any:
        """The throwaway PostgreSQL cluster of the tests (tests/support/pgcluster.py), started once per run; clients
        find its password in PGPASSFILE."""
        if self._cluster is None:
            sys.path.insert(0, str(REPO / "tests"))
            from support.pgcluster import Cluster

            self._cluster = Cluster()
            self._cluster.start()
            os.environ["PGPASSFILE"] = str(self._cluster.passfile)
        return self._cluster

    async def bounded(self, section: str, seconds: float) -> None:
        """Run one section; past `seconds` it is cancelled and recorded as a miss, not waited for."""
        with anyio.move_on_after(seconds) as scope:
            await getattr(self, section)()
        if scope.cancelled_caught:
            row = {"ratio": f"section ended within {seconds:g} s", "value": "hang", "goal": "ends", "met": False}
            self.record(section, {"hang": f"no result after {seconds:g} s: stopped"}, [row])

    def record(self, section: str, figures: dict[str, Any], ratios: list[dict[str, Any]]) -> None:
        self.results["sections"][section] = figures
        self.results["ratios"].extend({"section": section, **r} for r in ratios)
        print(f"\n## {section}")
        for name, value in figures.items():
            print(f"  {name}: {value}")
        for row in ratios:
            print(
                f"  ratio {row['ratio']}: {row['value']}"
                + (f"  (goal {row['goal']}, met: {row['met']})" if "goal" in row else "")
            )

    # -- sections ---------------------------------------------------------------------------------------

    async def transport(self) -> None:
        root = self.work / "transport-units"
        twenty_kb_unit(root)
        with Host(root, self.work / "transport-data", namespace="bench_transport") as host:
            tools = UnitTools(UnitService(host))
            async with (
                Bridge(bare_server(), config_root=self.work / "cfg-bare") as bare,
                Bridge(tools.server(), config_root=self.work / "cfg-unit") as ours,
                http_client(str(bare.url), bare.token) as bare_client,
                http_client(str(ours.url), ours.token) as unit_client,
            ):
                samples = await interleaved(
                    {
                        "bare_noop": lambda: bare_client.call_tool("noop", {}),
                        "unit_read_source_20kb": lambda: unit_client.call_tool(
                            "unit_read_source", {"unit_id": "big", "source_id": "__init__.py"}
                        ),
                    },
                    self.rounds,
                )
        figures = {k: summary(v) for k, v in samples.items()}
        self.record(
            "transport",
            figures,
            [
                ratio_row(
                    "unit_read_source(20 KB) / bare no-op tool, one call at a time (goal 1.2 retired by issue 24)",
                    figures["unit_read_source_20kb"],
                    figures["bare_noop"],
                    None,
                )
            ],
        )

    async def write_floor(self) -> None:
        """A unit_apply_patch write (server side, in this process) against its physical floor: compiling the same
        source and writing the same bytes durably (temporary file, fsync, rename), interleaved call by call."""
        root = self.work / "floor-units"
        twenty_kb_unit(root)
        floor = self.work / "floor-bytes" / "big.py"
        floor.parent.mkdir()
        source = (root / "big" / "__init__.py").read_text()
        texts = ("VALUE_0001 = 1  #", "VALUE_0001 = 2  #")
        state = {"unit": 0, "floor": 0}
        with Host(root, self.work / "floor-data", namespace="bench_floor") as host:
            service = UnitService(host)

            def patch() -> None:
                turn = state["unit"] = state["unit"] + 1
                service.apply_patch("big", "__init__.py", old=texts[(turn - 1) % 2], new=texts[turn % 2])

            def compile_and_write() -> None:
                turn = state["floor"] = state["floor"] + 1
                data = source.replace(texts[0], texts[turn % 2]).encode()
                compile(data, str(floor), "exec", dont_inherit=True)
                durable_write(floor, data)

            samples = await interleaved(
                {"unit_apply_patch_write_reload": partial(direct, patch), "compile_and_durable_write": partial(
                    direct, compile_and_write)},
                40 if self.quick else 200,
            )  # fmt: skip
        figures = {k: summary(v) for k, v in samples.items()}
        self.record(
            "write_floor",
            figures,
            [
                ratio_row(
                    "unit_apply_patch write+reload (server side) / compile + durable write of the same 20 KB",
                    figures["unit_apply_patch_write_reload"],
                    figures["compile_and_durable_write"],
                    1.3,
                )
            ],
        )

    async def served(self) -> None:
        """Edit → the new code serves: unit_apply_patch (answered once the unit runs the new code) against the
        filesystem server's edit_file plus a host that reloads the module on its file watcher (watchfiles'
        defaults, importlib.reload) and says so; both servers over stdio."""
        root = self.work / "served-units"
        twenty_kb_unit(root)
        fs_root = self.work / "served-fs"
        fs_root.mkdir()
        shutil.copy(root / "big" / "__init__.py", fs_root / "big.py")
        ours = StdioServerParameters(
            command=sys.executable,
            args=["-m", "unit_mcp.server", "--stdio", "--units", str(root), "--data-dir", str(self.work / "sd")],
        )
        fs_bin = self._fs_server()
        theirs = StdioServerParameters(command=fs_bin[0], args=[*fs_bin[1:], str(fs_root)])
        state = {"unit": 1, "fs": 1}
        async with AsyncExitStack() as stack:
            unit = await stack.enter_async_context(Client(stdio_client(ours), mode="legacy"))
            fs = await stack.enter_async_context(Client(stdio_client(theirs), mode="legacy"))
            host = await stack.enter_async_context(
                await anyio.open_process([sys.executable, "-c", WATCH_HOST, str(fs_root)])
            )
            assert host.stdout is not None
            said = BufferedByteReceiveStream(host.stdout)
            assert await said.receive_until(b"\n", 1 << 16) == b"1"

            async def unit_edit() -> None:
                value = state["unit"] = state["unit"] + 1
                arguments = {
                    "unit_id": "big", "source_id": "__init__.py",
                    "old": f"VALUE_0001 = {value - 1}  #", "new": f"VALUE_0001 = {value}  #",
                }  # fmt: skip
                result = await unit.call_tool("unit_apply_patch", arguments)
                assert not result.is_error, result.content

            async def fs_edit_until_served() -> None:
                value = state["fs"] = state["fs"] + 1
                edit = {"oldText": f"VALUE_0001 = {value - 1}  #", "newText": f"VALUE_0001 = {value}  #"}
                result = await fs.call_tool("edit_file", {"path": str(fs_root / "big.py"), "edits": [edit]})
                assert not result.is_error, result.content
                while int(await said.receive_until(b"\n", 1 << 16)) != value:
                    pass

            samples = await interleaved(
                {"unit_apply_patch_until_served": unit_edit, "fs_edit_file_then_watcher_reload": fs_edit_until_served},
                10 if self.quick else 40,
                warmup=2,
            )
            host.terminate()
        figures = {k: summary(v) for k, v in samples.items()}
        self.record(
            "served",
            figures,
            [
                ratio_row(
                    "edit→served: unit_apply_patch / fs edit_file + a watchfiles host's importlib.reload",
                    figures["unit_apply_patch_until_served"],
                    figures["fs_edit_file_then_watcher_reload"],
                    0.5,
                )
            ],
        )

    async def saturation(self) -> None:
        """Calls per second at saturation: 20 KB reads against bare no-op calls (MCP `ping`) of the same unit server
        (a `Bridge` in this process), each saturated by the same lean client processes."""
        root = self.work / "saturation-units"
        twenty_kb_unit(root)
        seconds, clients, rounds = (1.5, 8, 1) if self.quick else (4.0, 8, 3)
        totals = {"noop": [0, 0.0, 0], "read_20kb": [0, 0.0, 0]}  # calls, server CPU seconds, errors
        with Host(root, self.work / "saturation-data", namespace="bench_saturation") as host:
            tools = UnitTools(UnitService(host))
            async with Bridge(tools.server(), config_root=self.work / "cfg-saturation") as bridge:
                for turn in range(rounds + 1):  # the first turn of each side warms it up
                    for side, call in (("noop", ["ping", None]), ("read_20kb", READ_20KB)):
                        counts, server_cpu = await self._saturate(bridge, clients, seconds, lean=True, call=call)
                        if not turn:
                            continue
                        totals[side][0] += sum(c["calls"] for c in counts)
                        totals[side][1] += server_cpu
                        totals[side][2] += sum(c["errors"] for c in counts)
        figures: dict[str, Any] = {"clients": clients, "seconds_per_turn": seconds, "turns_per_side": rounds}
        for side, (calls, cpu, errors) in totals.items():
            figures[f"{side}_calls_per_second"] = round(calls / (seconds * rounds), 1)
            figures[f"{side}_server_cpu_ms_per_call"] = round(1000 * cpu / max(calls, 1), 3)
            figures[f"{side}_server_cpu_share_of_one_core"] = round(cpu / (seconds * rounds), 2)
            figures[f"{side}_errors"] = errors
        value = figures["read_20kb_calls_per_second"] / figures["noop_calls_per_second"]
        self.record(
            "saturation",
            figures,
            [{"ratio": "20 KB reads/s / no-op (ping) calls/s of the same server at saturation, same lean clients",
              "value": round(value, 3), "goal": ">= 0.8", "met": value >= 0.8}],
        )  # fmt: skip

    async def idle(self) -> None:
        """A server of 10,000 units left idle (watching, database polling where it applies): its CPU over a minute
        and its resident memory against a bare interpreter that imported the same modules. Opt-in (--only idle)."""
        count, seconds = (1000, 10.0) if self.quick else (10_000, 60.0)
        root = self.work / "idle-units"
        make_units(root, count, body="def total(items):\n    return sum(items)\n")
        server = subprocess.Popen(
            [sys.executable, "-m", "unit_mcp.server", "--units", str(root), "--data-dir", str(self.work / "idle-data")],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            read_ready_lines(server)
            await anyio.sleep(5.0)  # start-up work (the bytecode cache written, the warm test host) settles
            family = [server.pid, *descendants(server.pid)]
            before = {pid: cpu_seconds(pid) for pid in family}
            await anyio.sleep(seconds)
            used = sum(cpu_seconds(pid) - cpu for pid, cpu in before.items())
            rss, children_rss = rss_kib(server.pid), sum(rss_kib(pid) for pid in family[1:])
        finally:
            server.terminate()
            server.wait(20)
        empty = self.work / "idle-empty"
        empty.mkdir()
        server = subprocess.Popen(
            [sys.executable, "-m", "unit_mcp.server", "--units", str(empty), "--data-dir", str(self.work / "idle-d0")],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            read_ready_lines(server)
            await anyio.sleep(5.0)
            rss_empty = rss_kib(server.pid)
        finally:
            server.terminate()
            server.wait(20)

        async def bare_rss(modules: int) -> int:
            code = (
                "import importlib, sys; sys.path.insert(0, sys.argv[1]); "
                f"[importlib.import_module(f'unit_{{n:05d}}') for n in range({modules})]; "
                "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmRSS:')))"
            )
            return int((await anyio.run_process([sys.executable, "-c", code, str(root)])).stdout)

        bare, bare_empty = await bare_rss(count), await bare_rss(0)
        share = 100 * used / seconds
        figures = {
            "units": count,
            "idle_seconds": seconds,
            "cpu_percent_of_one_core": round(share, 3),
            "processes": len(family),
            "server_rss_kib": rss,
            "child_processes_rss_kib": children_rss,
            "bare_interpreter_rss_kib": bare,
            "server_without_units_rss_kib": rss_empty,
            "bare_interpreter_without_imports_rss_kib": bare_empty,
        }
        rows = [
            {"ratio": f"idle CPU, {count} units, % of one core (server and its children)", "value": round(share, 3),
             "goal": "<= 1.0", "met": share <= 1.0},
            {"ratio": f"resident memory, {count} units / a bare interpreter that imported them", "value": round(
                rss / bare, 3), "goal": "<= 1.5", "met": rss / bare <= 1.5},
            {"ratio": f"memory the {count} units add to the server / that they add to a bare interpreter",
             "value": round((rss - rss_empty) / (bare - bare_empty), 3)},
        ]  # fmt: skip
        self.record("idle", figures, rows)

    async def startup(self) -> None:
        """How soon a newcomer and a launching client are served: `scripts/serve` on a fresh clone of HEAD to its
        ready lines (first run, which installs into the clone's .venv with the package cache warm; a second run; a
        first run with pip's cache off), and exec to the answer of `initialize` over stdio, beside the official
        filesystem server's start as the anchor (both interleaved, each a fresh process)."""
        rounds = 5 if self.quick else 15
        fs_root = self.work / "startup-fs"
        fs_root.mkdir()
        ours = [sys.executable, "-m", "unit_mcp.server", "--stdio", "--no-watch"]
        sides = {"unit_mcp_stdio": ours, "fs_server_stdio": [*self._fs_server(), str(fs_root)]}
        samples: dict[str, list[float]] = {name: [] for name in sides}
        cpu: dict[str, list[float]] = {name: [] for name in sides}
        load_before = os.getloadavg()[0]
        for turn in range(rounds + 1):  # the first turn warms the page cache
            for name, command in sides.items():
                data = ["--data-dir", str(self.work / f"startup-data-{turn}")] if name == "unit_mcp_stdio" else []
                wall, used = await anyio.to_thread.run_sync(initialize_answered, [*command, *data])
                if turn:
                    samples[name].append(wall)
                    cpu[name].append(used)
        figures: dict[str, Any] = {name: summary(values) for name, values in samples.items()}
        for name, values in cpu.items():
            figures[f"{name}_cpu_ms_median"] = round(statistics.median(values), 1)
        ours_ms = figures["unit_mcp_stdio"]["median_ms"]
        rows: list[dict[str, Any]] = [
            {"ratio": "stdio: exec to the answer of initialize, unit-mcp (ms)", "value": round(ours_ms),
             "goal": "<= 400 (quiet machine)", "met": ours_ms <= 400},
            ratio_row("stdio initialize answered: unit-mcp / the filesystem server (Node)", figures["unit_mcp_stdio"],
                      figures["fs_server_stdio"], None),
        ]  # fmt: skip
        for name, env, clone in (
            ("first_run_warm_cache", {}, "startup-clone"),
            ("second_run", {}, "startup-clone"),
            ("first_run_pip_cache_off", {"PIP_NO_CACHE_DIR": "1"}, "startup-clone-cold"),
        ):
            seconds, used = await anyio.to_thread.run_sync(scripts_serve_ready, self.work / clone, env)
            figures[f"scripts_serve_{name}_s"] = round(seconds, 1)
            figures[f"scripts_serve_{name}_cpu_s"] = round(used, 1)
        first = figures["scripts_serve_first_run_warm_cache_s"]
        rows += [
            {"ratio": "scripts/serve first run on a fresh clone to the ready lines, package cache warm (s)",
             "value": first, "goal": "<= 25", "met": first <= 25},
            {"ratio": "scripts/serve second run to the ready lines (s)",
             "value": figures["scripts_serve_second_run_s"]},
            {"ratio": "scripts/serve first run on a fresh clone, pip's cache off (s)",
             "value": figures["scripts_serve_first_run_pip_cache_off_s"]},
        ]  # fmt: skip
        figures["load_average_1min"] = f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
        self.record("startup", figures, rows)

    async def live(self) -> None:
        """A web app under a constant-rate load while its code changes: unit-mcp (an agent's patch+reload calls
        through MCP), `uvicorn --reload` (file edits) and a 2-worker rolling restart, one after the other in this
        run (scripts/bench_live.py says how)."""
        import bench_live

        baseline_s, seconds, edits = (5.0, 15.0, 25) if self.quick else (15.0, 60.0, 100)
        bound = baseline_s + seconds + 120
        contestants = {
            "unit_mcp": bench_live.ours(self.work / "live-ours", baseline_s, seconds, edits, http_client),
            "uvicorn_reload": bench_live.peer(self.work / "live-reload", baseline_s, seconds, edits, rolling=False),
            "rolling_2_workers": bench_live.peer(self.work / "live-rolling", baseline_s, seconds, edits, rolling=True),
        }
        figures: dict[str, Any] = {"load": f"{bench_live.RATE} req/s over {bench_live.CONNECTIONS} keep-alive "
                                   f"connections (half POSTs) + {bench_live.SSE_CLIENTS} SSE clients; "
                                   f"{baseline_s:g} s baseline and {edits} changes in {seconds:g} s, in "
                                   f"{bench_live.ROUNDS} alternating blocks (quiet, changing)"}  # fmt: skip
        for name, run in contestants.items():
            figures[name] = await bench_live.bounded(bound, run)
        rows: list[dict[str, Any]] = []
        for name in contestants:
            got = figures[name]
            ours = name == "unit_mcp"
            if "hang" in got:
                rows.append({"ratio": f"{name}: run", "value": got["hang"], "goal": "finishes", "met": False})
                continue
            changing, baseline = got["changing"], got["baseline"]
            total = changing["requests"] + baseline["requests"]
            failed = changing["failed"] + baseline["failed"]
            ratio = changing["p99_in_second_after_change_ms"] / baseline["p99_ms"]
            backwards = changing["versions_backwards"] + baseline["versions_backwards"]
            found: list[tuple[str, Any, str, bool]] = [
                (f"failed requests of {total}", failed, "0", failed == 0),
                ("lost writes", got["lost_writes"], "0", got["lost_writes"] == 0),
                ("version went backwards on a connection", backwards, "0", backwards == 0),
                ("p99 in the second after a change / baseline p99", round(ratio, 2), "<= 1.2", ratio <= 1.2),
                ("SSE streams broken", changing["sse_breaks"], "", True),
            ]
            if ours:
                blocked = got["blocked_ms"]["p99"]
                bad_failed = changing["failed_within_5s_of_bad_changes"]
                refused = all(r["error"] for r in got["bad_changes"])
                found += [
                    ("blocked window p99 (ms)", blocked, "<= 5", blocked <= 5),
                    ("syntax error + hanging import refused, failed requests within 5 s", bad_failed, "0",
                     refused and bad_failed == 0),
                ]  # fmt: skip
            for label, value, goal, met in found:
                row: dict[str, Any] = {"ratio": f"{name}: {label}", "value": value}
                if ours and goal:
                    row |= {"goal": goal, "met": met}
                rows.append(row)
        for name in contestants:  # each change's report was for the rows; the written figures keep the bad ones
            with contextlib.suppress(KeyError):
                del figures[name]["changing"]["changes"]
        self.record("live", figures, rows)

    async def resolve(self) -> None:
        """unit_resolve (scripts/bench_resolve.py): top-1 / top-3 of the lexical ranker, the embedding alone and
        the shipped ranker on the paraphrase set, the held-out set and the second held-out set (never tuned on);
        the shipped ranker at 10,000 units; a host of 10,000 units started and resolved through the service.
        Bounded: about 30 s (5 with --quick)."""
        sys.path.insert(0, str(REPO / "scripts"))
        from bench_resolve import at_scale, quality

        figures: dict[str, Any] = {"quality": quality(self.work)}
        rows = []
        for name, by_ranker in figures["quality"].items():
            shipped = by_ranker["shipped"]
            goal = {"queries": ("top-1 >= 98%", 0.98), "heldout": ("top-1 >= 88%", 0.88)}.get(name)
            cells = " | ".join(f"{ranker} {f['top1']:.1%} / {f['top3']:.1%}" for ranker, f in by_ranker.items())
            row = {"ratio": f"unit_resolve {name} ({shipped['queries']} queries): top-1 / top-3, {cells}",
                   "value": f"{shipped['top1']:.1%} / {shipped['top3']:.1%}"}  # fmt: skip
            if goal is not None:
                row.update(goal=goal[0], met=shipped["top1"] >= goal[1] and shipped["empty"] == 0)
            else:
                row.update(goal="report (never tuned on); 0 empty", met=shipped["empty"] == 0)
            rows.append(row)
        count = 1000 if self.quick else 10_000
        scale = at_scale(count, queries=100 if self.quick else 400)
        figures["scale"] = scale
        rows += [
            {"ratio": f"unit_resolve shipped ranker, {count} units: query p99 ms (median {scale['query_median_ms']})",
             "value": scale["query_p99_ms"], "goal": "<= 2", "met": scale["query_p99_ms"] <= 2},
            {"ratio": f"the same queries, CPU ms of the querying thread: p99 (median {scale['query_cpu_median_ms']}; "
                      f"load average {scale['load_average']} on {scale['cores']} cores while measured)",
             "value": scale["query_cpu_p99_ms"]},
            {"ratio": f"one unit changed, re-embedded, {count} units: p99 ms (median {scale['reembed_median_ms']})",
             "value": scale["reembed_p99_ms"], "goal": "<= 1", "met": scale["reembed_p99_ms"] <= 1},
            {"ratio": f"memory the meaning ranker adds at {count} units, KiB traced: its vectors and the "
                      f"identifier index (the model's table, 16 MB, loaded once per process, comes on top)",
             "value": scale["shipped_index_kib"] - scale["lexical_index_kib"]},
            {"ratio": f"memory of the lexical index at {count} units, KiB traced (about 200 MB before its letter "
                      f"trigrams were kept as two-byte numbers)",
             "value": scale["lexical_index_kib"], "goal": "<= 40000", "met": scale["lexical_index_kib"] <= 40_000},
            {"ratio": f"memory of the identifier index (names, typo keys) at {count} units, KiB traced: these units "
                      f"(few shared words); {count} units of five made-up identifiers each (the typo keys' worst "
                      f"case; {scale['names_index_varied_kib']} KiB)",
             "value": scale["names_index_kib"]},
        ]  # fmt: skip
        root = self.work / "resolve-scale-units"
        make_units(root, count, body="def total(items):\n    return sum(items)\n")
        with Host(root, self.work / "resolve-scale-data", namespace="bench_resolve_scale"):
            pass  # the first start compiles every unit; the one measured reuses its bytecode, as in `scale`
        started = time.perf_counter()
        with Host(root, self.work / "resolve-scale-data", namespace="bench_resolve_scale") as host:
            start_ms = (time.perf_counter() - started) * 1000
            service = UnitService(host)
            started = time.perf_counter()
            service.resolve("widget 42 totals")
            first_ms = (time.perf_counter() - started) * 1000
        figures["host_start_ms"], figures["first_resolve_ms"] = round(start_ms, 1), round(first_ms, 1)
        rows += [
            {"ratio": f"host restart, {count} units, ms (resolve indexes nothing at start)", "value": round(start_ms),
             "goal": "<= 1000", "met": start_ms <= 1000},
            {"ratio": f"first unit_resolve after start, {count} units: facts read, indexed and embedded, ms",
             "value": round(first_ms)},
        ]  # fmt: skip
        self.record("resolve", figures, rows)

    async def edits(self) -> None:
        """The edit corpus (tests/data/edits, issue 37) through the tolerant edits and the exact-only matcher side by
        side, within a time bound (cases not reached are counted as not run); and what a miss costs on a 2,000-line
        source. All in this process: it measures the matcher, not the transport."""
        from support.edit_corpus import evaluate, load

        from unit_mcp import patching

        edits, _ = load()
        if self.quick:
            edits = edits[:: max(1, len(edits) // 150)]
        budget = 120.0 if self.quick else 900.0  # seconds for both passes, each pass at most half
        figures: dict[str, Any] = {"edits": len(edits)}
        rows = []
        for name, tolerant in (("tolerant", True), ("exact_only", False)):
            deadline = time.monotonic() + budget / 2
            done = 0
            total: Any = None
            by: dict[str, Any] = {}
            step = 50
            while done < len(edits) and time.monotonic() < deadline:
                part, part_by, _ = await anyio.to_thread.run_sync(
                    partial(evaluate, edits[done : done + step], tolerant=tolerant)
                )
                total = _merge_tally(total, part)
                for key, tally in part_by.items():
                    by[key] = _merge_tally(by.get(key), tally)
                done += step
            figures[name] = {"edits_run": min(done, len(edits)), **total.figures()}
            figures[f"{name}_by_perturbation"] = {
                k: f"{v.applied_right}/{v.meant} right, {v.misapplied} misapplied, {v.refused} refused"
                + (f" ({v.retried_right} retried right)" if tolerant and v.refused else "")
                for k, v in sorted(by.items())
            }
        tol, exact = figures["tolerant"], figures["exact_only"]
        retry = tol["retry_right"] or 0.0
        rows += [
            {"ratio": "unambiguous edits applied with the intended bytes, first try: tolerant / exact-only",
             "value": f"{tol['first_try']:.2%} / {exact['first_try']:.2%}", "goal": ">= 99%",
             "met": tol["first_try"] >= 0.99},
            {"ratio": "edits misapplied (bytes other than intended): tolerant / exact-only",
             "value": f"{tol['misapplied']} / {exact['misapplied']}", "goal": "0", "met": tol["misapplied"] == 0},
            {"ratio": "refusals carrying a nearest candidate (tolerant)",
             "value": f"{tol['refused_with_candidate']}/{tol['refused']}", "goal": "all",
             "met": tol["refused_with_candidate"] == tol["refused"]},
            {"ratio": "refused edits whose retry, built only from the refusal, is right (tolerant)",
             "value": f"{retry:.2%}", "goal": ">= 90%", "met": retry >= 0.9},
        ]  # fmt: skip

        source = "".join(f"def f{n}(x):\n    return x + {n}\n\n\n" for n in range(500))  # 2,000 lines
        miss_old, miss_new = "def nowhere(y):\n    return y * 7\n", "def nowhere(y):\n    return y\n"
        hit_old, hit_new = "def f250(x):\n    return x + 250\n", "def f250(x):\n    return x\n"

        def tolerant_miss() -> None:
            with contextlib.suppress(UnitError):
                patching.edit_exact(source, miss_old, miss_new, current_hash="sha256:x")

        def exact_miss() -> None:
            with contextlib.suppress(UnitError):
                patching.replace_exact(source, miss_old, miss_new)

        timings: dict[str, list[float]] = {"tolerant_miss": [], "exact_only_miss": [], "edit_exact_hit": [],
                                           "replace_exact_hit": []}  # fmt: skip
        calls = {"tolerant_miss": tolerant_miss, "exact_only_miss": exact_miss,
                 "edit_exact_hit": lambda: patching.edit_exact(source, hit_old, hit_new),
                 "replace_exact_hit": lambda: patching.replace_exact(source, hit_old, hit_new)}  # fmt: skip
        for _ in range(self.rounds):
            for key, call in calls.items():
                began = time.perf_counter()
                call()
                timings[key].append((time.perf_counter() - began) * 1000)
        for key, samples in timings.items():
            figures[key] = summary(samples)
        miss = figures["tolerant_miss"]["median_ms"]
        hit = 1000 * (figures["edit_exact_hit"]["median_ms"] - figures["replace_exact_hit"]["median_ms"])
        rows += [
            {"ratio": "a tolerant miss on a 2,000-line source (every matcher, then the nearest places), ms",
             "value": miss, "goal": "<= 5", "met": miss <= 5},
            {"ratio": "an exact match on a 2,000-line source: edit_exact's extra time over replace_exact, µs",
             "value": round(hit, 1), "goal": "<= 20", "met": hit <= 20},
        ]  # fmt: skip
        self.record("edits", figures, rows)

    async def filesystem(self) -> None:
        """Against the official filesystem server, each on its best transport: stdio for both."""
        fs_bin = self._fs_server()
        root = self.work / "fs-units"
        twenty_kb_unit(root)
        # The same 20 KB as a non-Python source: a dry run there skips the syntax check (compile()).
        shutil.copy(root / "big" / "__init__.py", root / "big" / "data.txt")
        fs_root = self.work / "fs-root"
        fs_root.mkdir()
        shutil.copy(root / "big" / "__init__.py", fs_root / "big.py")
        fs_file = str(fs_root / "big.py")
        ours = StdioServerParameters(
            command=sys.executable,
            args=[
                "-m",
                "unit_mcp.server",
                "--stdio",
                "--no-watch",
                "--units",
                str(root),
                "--data-dir",
                str(self.work / "fs-data"),
            ],
        )
        theirs = StdioServerParameters(command=fs_bin[0], args=[*fs_bin[1:], str(fs_root)])
        state = {"unit": 0, "fs": 0, "txt": 0}
        texts = ("VALUE_0001 = 1  #", "VALUE_0001 = 2  #")
        async with AsyncExitStack() as stack:
            unit = await stack.enter_async_context(Client(stdio_client(ours), mode="legacy"))
            fs = await stack.enter_async_context(Client(stdio_client(theirs), mode="legacy"))

            def unit_patch(dry: bool, source_id: str = "__init__.py") -> Callable[[], Awaitable[Any]]:
                counter = "unit" if source_id == "__init__.py" else "txt"

                async def call() -> None:
                    old, new = texts[state[counter] % 2], texts[(state[counter] + 1) % 2]
                    if not dry:
                        state[counter] += 1
                    args = {"unit_id": "big", "source_id": source_id, "old": old, "new": new, "dry_run": dry}
                    result = await unit.call_tool("unit_apply_patch", args)
                    assert not result.is_error, result.content

                return call

            def fs_edit(dry: bool) -> Callable[[], Awaitable[Any]]:
                async def call() -> None:
                    old, new = texts[state["fs"] % 2], texts[(state["fs"] + 1) % 2]
                    if not dry:
                        state["fs"] += 1
                    args = {"path": fs_file, "edits": [{"oldText": old, "newText": new}], "dryRun": dry}
                    result = await fs.call_tool("edit_file", args)
                    assert not result.is_error, result.content

                return call

            read_args = {"unit_id": "big", "source_id": "__init__.py"}
            reads = await interleaved(
                {
                    "unit_read_source": partial(unit.call_tool, "unit_read_source", read_args),
                    "fs_read_text_file": partial(fs.call_tool, "read_text_file", {"path": fs_file}),
                },
                self.rounds,
            )
            dry = await interleaved(
                {
                    "unit_apply_patch_dry_run": unit_patch(True),
                    "fs_edit_file_dry_run": fs_edit(True),
                    "unit_apply_patch_dry_run_txt": unit_patch(True, "data.txt"),
                },
                self.rounds,
            )
            real = await interleaved(
                {"unit_apply_patch_reload": unit_patch(False), "fs_edit_file": fs_edit(False)}, self.rounds // 2
            )
        figures = {k: summary(v) for group in (reads, dry, real) for k, v in group.items()}
        self.record(
            "filesystem",
            figures,
            [
                ratio_row(
                    "unit_read_source / fs read_text_file",
                    figures["unit_read_source"],
                    figures["fs_read_text_file"],
                    1.0,
                ),
                ratio_row(
                    "unit_apply_patch dry_run, non-Python file / fs edit_file dryRun",
                    figures["unit_apply_patch_dry_run_txt"],
                    figures["fs_edit_file_dry_run"],
                    1.0,
                ),
                ratio_row(
                    "unit_apply_patch dry_run, Python file (with its syntax check) / fs edit_file dryRun",
                    figures["unit_apply_patch_dry_run"],
                    figures["fs_edit_file_dry_run"],
                    1.3,
                ),
                ratio_row(
                    "unit_apply_patch (write+reload) / fs edit_file",
                    figures["unit_apply_patch_reload"],
                    figures["fs_edit_file"],
                    1.5,
                ),
            ],
        )

    def _fs_server(self) -> list[str]:
        entry = BENCH_TOOLS / "node_modules" / "@modelcontextprotocol" / "server-filesystem" / "dist" / "index.js"
        if not entry.exists():
            subprocess.run(
                ["npm", "install", "--prefix", str(BENCH_TOOLS), "--no-audit", "--no-fund", FS_SERVER], check=True
            )
        return ["node", str(entry)]

    async def reload(self) -> None:
        root = self.work / "reload-units"
        folder = root / "tenmods"
        ten_module_unit(folder)
        state = {"v": 0}
        with Host(root, self.work / "reload-data", namespace="bench_reload") as host:
            service = UnitService(host)

            async def patch() -> None:
                old = f"VERSION = {state['v']}"
                state["v"] += 1
                await anyio.to_thread.run_sync(
                    lambda: service.apply_patch("tenmods", "__init__.py", old=old, new=f"VERSION = {state['v']}")
                )

            code = (
                "import sys, time; sys.path.insert(0, sys.argv[1]); t = time.perf_counter(); import tenmods; "
                "print((time.perf_counter() - t) * 1000)"
            )
            bare: list[float] = []

            async def fresh_import() -> None:
                out = await anyio.run_process([sys.executable, "-B", "-c", code, str(root)])
                bare.append(float(out.stdout.decode().strip()))

            rounds = 20 if self.quick else 60
            samples = await interleaved(
                {"patch_to_reloaded": patch, "fresh_interpreter_import": fresh_import}, rounds, warmup=2
            )
        figures = {
            "patch_to_reloaded": summary(samples["patch_to_reloaded"]),
            "bare_import_in_fresh_interpreter": summary(bare[-rounds:]),
        }
        self.record(
            "reload",
            figures,
            [
                ratio_row(
                    "patch→reloaded (10 modules) / bare import",
                    figures["patch_to_reloaded"],
                    figures["bare_import_in_fresh_interpreter"],
                    None,
                )
            ],
        )

    async def scale(self) -> None:
        big_count = 1000 if self.quick else 10_000
        figures: dict[str, Any] = {}
        services = {}
        stack = AsyncExitStack()
        hosts = []
        for count in (100, big_count):
            root = self.work / f"scale-{count}"
            make_units(root, count, body="def total(items):\n    return sum(items)\n")
            # The first start of a data dir compiles every unit; a restart reuses that start's bytecode cache.
            for start in ("start", "restart"):
                host = Host(root, self.work / f"scale-data-{count}", namespace=f"bench_scale_{count}")
                started = time.perf_counter()
                host.start()
                figures[f"host_{start}_{count}_units_ms"] = round((time.perf_counter() - started) * 1000, 1)
                if start == "start":
                    host.close()
            hosts.append(host)
            services[count] = UnitService(host)
        # The same units imported by Python itself from sys.path with their .pyc present (the first run writes
        # them): what the start figures are worth on this machine, whatever its speed.
        pycache = self.work / "scale-pycache"
        await bare_import_ms(self.work / f"scale-{big_count}", big_count, pycache)
        bare = [await bare_import_ms(self.work / f"scale-{big_count}", big_count, pycache) for _ in range(3)]
        figures[f"bare_import_{big_count}_units_ms"] = round(statistics.median(bare), 1)
        try:
            rounds = 10 if self.quick else 20
            # Called on the loop, not through a worker thread: on a loaded machine waking the loop after the
            # thread's work costs up to milliseconds, the same for both sides, which would hide how they scale.
            calls: dict[str, Callable[[], Awaitable[Any]]] = {}
            for count, service in services.items():
                calls[f"list_{count}"] = partial(direct, service.list)
                calls[f"resolve_{count}"] = partial(direct, service.resolve, "widget 42 totals")
            samples = await interleaved(calls, rounds, warmup=1)
        finally:
            for host in hosts:
                host.close()
            await stack.aclose()
        figures.update({k: summary(v) for k, v in samples.items()})
        self.record(
            "scale",
            figures,
            [
                ratio_row(f"unit_list {big_count}/100 units", figures[f"list_{big_count}"], figures["list_100"], None),
                ratio_row(
                    f"unit_resolve {big_count}/100 units",
                    figures[f"resolve_{big_count}"],
                    figures["resolve_100"],
                    10.0 if big_count == 10_000 else None,
                ),
                start_row(big_count, figures[f"host_start_{big_count}_units_ms"]),
                start_row(big_count, figures[f"host_restart_{big_count}_units_ms"], "restart, same data dir"),
                *(bare_row(big_count, figures, which) for which in ("start", "restart")),
            ],
        )

    async def loaders(self) -> None:
        """The SQLite and PostgreSQL loaders against the folder loader: patch→reloaded of one ten-module unit,
        unit_list and the host's start."""
        from unit_mcp.units import copy_units, open_loader

        folder = self.work / "loader-units"
        unit = folder / "tenmods"
        ten_module_unit(unit)
        big_count = 1000 if self.quick else 10_000
        many = self.work / "loader-many"
        make_units(many, big_count, body="def total(items):\n    return sum(items)\n")
        cluster = self.cluster()
        stores = {
            "folder": str(folder),
            "sqlite": f"sqlite:{self.work / 'loader-units.db'}",
            "postgres": cluster.new_database(),
        }
        big = {
            "folder": str(many),
            "sqlite": f"sqlite:{self.work / 'loader-many.db'}",
            "postgres": cluster.new_database(),
        }
        for source, target in [(folder, stores[n]) for n in ("sqlite", "postgres")] + [
            (many, big[n]) for n in ("sqlite", "postgres")
        ]:
            opened = open_loader(target)
            copy_units(open_loader(source, read_only=True), opened)
            opened.close()
        figures: dict[str, Any] = {}
        hosts: list[Host] = []
        calls: dict[str, Callable[[], Awaitable[Any]]] = {}
        try:
            for name in ("folder", "sqlite", "postgres"):
                host = Host(stores[name], self.work / f"loader-data-{name}", namespace=f"bench_loader_{name}")
                hosts.append(host.start())
                service = UnitService(host)
                version = {"v": 0}

                def patch(service: UnitService = service, version: dict[str, int] = version) -> Any:
                    old = f"VERSION = {version['v']}"
                    version["v"] += 1
                    return service.apply_patch("tenmods", "__init__.py", old=old, new=f"VERSION = {version['v']}")

                calls[f"patch_to_reloaded_{name}"] = (lambda p: lambda: anyio.to_thread.run_sync(p))(patch)
            starts: dict[str, list[float]] = {name: [] for name in big}
            for round_ in range(3):  # interleaved, each from a new data dir; the last hosts stay for unit_list
                for name in ("folder", "sqlite", "postgres"):
                    label = f"{name}_{round_}"
                    host = Host(big[name], self.work / f"loader-big-{label}", namespace=f"bench_loader_big_{label}")
                    started = time.perf_counter()
                    host.start()
                    starts[name].append((time.perf_counter() - started) * 1000)
                    if round_ < 2:
                        host.close()
                        continue
                    hosts.append(host)
                    calls[f"list_{big_count}_{name}"] = (lambda s: lambda: anyio.to_thread.run_sync(s.list))(
                        UnitService(host)
                    )
            for name, taken in starts.items():
                figures[f"host_start_{big_count}_units_{name}_ms"] = round(statistics.median(taken), 1)
            samples = await interleaved(calls, 20 if self.quick else 60, warmup=2)
        finally:
            for host in hosts:
                host.close()
        figures.update({k: summary(v) for k, v in samples.items()})
        self.record(
            "loaders",
            figures,
            [
                ratio_row(
                    "patch→reloaded (10 modules) SQLite / folder",
                    figures["patch_to_reloaded_sqlite"],
                    figures["patch_to_reloaded_folder"],
                    None,
                ),
                ratio_row(
                    f"unit_list {big_count} units SQLite / folder",
                    figures[f"list_{big_count}_sqlite"],
                    figures[f"list_{big_count}_folder"],
                    None,
                ),
                ratio_row(
                    "patch→reloaded (10 modules) PostgreSQL / folder",
                    figures["patch_to_reloaded_postgres"],
                    figures["patch_to_reloaded_folder"],
                    None,
                ),
                ratio_row(
                    f"unit_list {big_count} units PostgreSQL / folder",
                    figures[f"list_{big_count}_postgres"],
                    figures[f"list_{big_count}_folder"],
                    None,
                ),
                *(
                    start_row(big_count, figures[f"host_start_{big_count}_units_{name}_ms"], f"start, {shown}")
                    for name, shown in (("postgres", "PostgreSQL"), ("sqlite", "SQLite"), ("folder", "folder"))
                ),
            ],
        )

    async def replicas(self) -> None:
        """Three `unit_mcp.server` processes on one PostgreSQL database: from sending a patch to the first until
        the other two serve it (their unit_snapshot shows it), over 100 patches."""
        database = self.cluster().new_database()
        folder = self.work / "replica-units"
        make_units(folder, 1, body='VERSION = 0\n\n\ndef snapshot():\n    return {"version": VERSION}\n')
        unit = {"unit_id": "unit_00000", "source_id": "unit_00000.py"}
        subprocess.run([sys.executable, "-m", "unit_mcp.units", "copy", str(folder), database], check=True)
        servers = [
            subprocess.Popen(
                [sys.executable, "-m", "unit_mcp.server", "--units", database],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(3)
        ]
        samples: list[float] = []
        try:
            printed = [read_ready_lines(server) for server in servers]
            async with AsyncExitStack() as stack:
                clients = [await stack.enter_async_context(http_client(p["MCP_URL"], p["MCP_TOKEN"])) for p in printed]

                async def served(client: Client, version: int) -> None:
                    while True:
                        result = await client.call_tool("unit_snapshot", {"unit_id": unit["unit_id"]})
                        if (result.structured_content or {}).get("state", {}).get("version") == version:
                            return

                for version in range(1, (30 if self.quick else 100) + 1):
                    started = time.perf_counter()
                    async with anyio.create_task_group() as group:
                        group.start_soon(
                            partial(
                                clients[0].call_tool,
                                "unit_apply_patch",
                                {**unit, "old": f"VERSION = {version - 1}\n", "new": f"VERSION = {version}\n"},
                            )
                        )
                        for client in clients[1:]:
                            group.start_soon(served, client, version)
                    samples.append((time.perf_counter() - started) * 1000)
        finally:
            for server in servers:
                server.terminate()
                server.wait(20)
        figures = {"patch_to_served_by_2_other_servers": summary(samples)}
        p95 = figures["patch_to_served_by_2_other_servers"]["p95_ms"]
        row = {"ratio": "patch→served by the 2 other servers, p95 ms", "value": p95, "goal": "≤ 50", "met": p95 <= 50}
        self.record("replicas", figures, [row])

    async def log(self) -> None:
        sizes = {"1MB": 1 << 20, "1GB": (64 << 20) if self.quick else (1 << 30)}
        services = {}
        hosts = []
        line = "2026-12-02 12:00:00,000 INFO units.counter: count is now 12345 and the widget total is fine\n"
        chunk = (line * (1 << 20 // len(line) + 1)).encode()
        for label, size in sizes.items():
            root = self.work / f"log-units-{label}"
            root.mkdir()
            host = Host(root, self.work / f"log-data-{label}", namespace=f"bench_log_{label}")
            host.start()
            with host.log_path.open("ab") as handle:
                written = 0
                while written < size:
                    handle.write(chunk)
                    written += len(chunk)
            hosts.append(host)
            services[label] = UnitService(host)
        try:
            calls: dict[str, Callable[[], Awaitable[Any]]] = {}
            for label, service in services.items():
                calls[f"tail_100_{label}"] = partial(anyio.to_thread.run_sync, service.read_log)
                grep = partial(service.read_log, grep="count is now", lines=50)
                calls[f"grep_tail_{label}"] = partial(anyio.to_thread.run_sync, grep)
            samples = await interleaved(calls, self.rounds // 3)
        finally:
            for host in hosts:
                host.close()
        figures = {k: summary(v) for k, v in samples.items()}
        big = list(sizes)[1]
        self.record(
            "log",
            figures,
            [ratio_row(f"unit_read_log tail {big}/1MB", figures[f"tail_100_{big}"], figures["tail_100_1MB"], 2.0)],
        )

    async def changelog(self) -> None:
        """What the change log adds to a write (its one record, with the 20 KB source's bytes before and after)
        against the whole unit_apply_patch, on both loaders; unit_changes over 100,000 records against 1,000."""
        from unit_mcp.units import copy_units, open_loader

        folder = self.work / "changelog-units"
        twenty_kb_unit(folder)
        store = f"sqlite:{self.work / 'changelog-units.db'}"
        copy_units(open_loader(folder, read_only=True), open_loader(store))
        texts = ("VALUE_0001 = 1  #", "VALUE_0001 = 2  #")
        calls: dict[str, Callable[[], Awaitable[Any]]] = {}
        hosts = []
        for name, units in (("folder", str(folder)), ("sqlite", store)):
            host = Host(units, self.work / f"changelog-data-{name}", namespace=f"bench_changelog_{name}")
            host.start()
            hosts.append(host)
            service = UnitService(host)
            state = {"n": 0}
            data = service.loader.read(Source("big", "directory", "__init__.py"))
            record = SourceChange("big", "__init__.py", "modified", "sha256:0", "sha256:1", data, data)

            def patch(service: UnitService = service, state: dict[str, int] = state) -> None:
                old, new = texts[state["n"] % 2], texts[(state["n"] + 1) % 2]
                state["n"] += 1
                service.apply_patch("big", "__init__.py", old=old, new=new)

            def one_record(service: UnitService = service, record: SourceChange = record) -> None:
                service.change_log.record(
                    caller=NOBODY, tool="unit_apply_patch", unit_id="big", source_id="__init__.py",
                    outcome="applied", sources=[record],
                )  # fmt: skip

            calls[f"unit_apply_patch_{name}"] = partial(direct, patch)
            calls[f"change_record_{name}"] = partial(direct, one_record)
        try:
            writes = await interleaved(calls, self.rounds // 3)
        finally:
            for host in hosts:
                host.close()
        sizes = (1_000, 10_000 if self.quick else 100_000)
        reads: dict[str, Callable[[], Awaitable[Any]]] = {}
        for count in sizes:
            data_dir = self.work / f"changelog-read-{count}"
            data_dir.mkdir(mode=0o700)
            log = SqliteChangeLog(data_dir / "changes.db", Retention(records=10**9), private=True)
            bulk_changes(log, count)
            log.close()
            root = self.work / f"changelog-read-units-{count}"
            root.mkdir()
            host = Host(root, data_dir, namespace=f"bench_changes_{count}", change_retention=Retention(records=10**9))
            host.start()
            hosts.append(host)
            service = UnitService(host)
            reads[f"unit_changes_{count}"] = partial(direct, service.changes)
            reads[f"unit_changes_one_unit_{count}"] = partial(direct, partial(service.changes, unit_id="unit_7"))
        try:
            listed = await interleaved(reads, self.rounds // 3)
        finally:
            for host in hosts[2:]:
                host.close()
        figures = {k: summary(v) for group in (writes, listed) for k, v in group.items()}
        big = sizes[1]
        self.record(
            "changelog",
            figures,
            [
                *(
                    ratio_row(
                        f"change log record / unit_apply_patch ({name}, 20 KB source)",
                        figures[f"change_record_{name}"],
                        figures[f"unit_apply_patch_{name}"],
                        0.1,
                    )
                    for name in ("folder", "sqlite")
                ),
                ratio_row(
                    f"unit_changes (50 newest) {big:,}/1,000 records",
                    figures[f"unit_changes_{big}"],
                    figures["unit_changes_1000"],
                    2.0,
                ),
                ratio_row(
                    f"unit_changes of one unit in 100 {big:,}/1,000 records",
                    figures[f"unit_changes_one_unit_{big}"],
                    figures["unit_changes_one_unit_1000"],
                    None,
                ),
            ],
        )

    async def otel(self) -> None:
        """Tracing's cost, three sides interleaved call by call: no tracer provider set ("off"), the same code with
        our spans bypassed ("before": tracing's helpers replaced by no-ops, as before issue 39), and the SDK with an
        in-memory exporter ("on", its own server built with the provider set, so it keeps the SDK's server spans).
        Two calls: a no-tool turn (the runner, a function model) and a unit_list call over HTTP. Wall and CPU time
        (this process: client, server and runner all run in it) per call. Bounded to 5 minutes."""
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from unit_mcp import tracing
        from unit_mcp.agent import AgentApprovals, AgentRegistry, AgentRunner, AgentToolSurface, FunctionAgent

        assert not tracing.enabled(), "the otel section needs a process with no tracer provider set"
        helpers = ("span", "set_attributes", "set_content", "add_event", "fail", "inject_meta", "environment")
        ours = {name: getattr(tracing, name) for name in helpers}
        off_span = tracing._OFF
        bypass = {name: (lambda *a, **k: None) for name in helpers} | {
            "span": lambda *a, **k: off_span,
            "inject_meta": lambda meta: meta,
            "environment": dict,
        }
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))

        def side(name: str) -> None:
            """Switch this process to one side: the API's global provider set or not (its private global: the API
            sets it once), our helpers or the no-ops."""
            trace._TRACER_PROVIDER = provider if name == "on" else None  # type: ignore[attr-defined]
            for helper, fn in (bypass if name == "before" else ours).items():
                setattr(tracing, helper, fn)

        rounds = 60 if self.quick else 500
        root = self.work / "otel-units"
        twenty_kb_unit(root)
        registry = AgentRegistry()
        registry.register("f", lambda deps: FunctionAgent(lambda request, ctx: "ok", id="f"))
        samples: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        with (
            anyio.fail_after(300),
            Host(root, self.work / "otel-data", namespace="bench_otel") as host,
        ):
            tools = UnitTools(UnitService(host))
            async with AsyncExitStack() as stack:
                side("off")
                plain = await stack.enter_async_context(Bridge(tools.server(), config_root=self.work / "cfg-otel"))
                side("on")
                traced = await stack.enter_async_context(Bridge(tools.server(), config_root=self.work / "cfg-otel-on"))
                side("off")
                clients = {
                    "before": await stack.enter_async_context(http_client(str(plain.url), plain.token)),
                    "off": await stack.enter_async_context(http_client(str(plain.url), plain.token)),
                    "on": await stack.enter_async_context(http_client(str(traced.url), traced.token)),
                }
                runner = await stack.enter_async_context(
                    AgentRunner(
                        store=self.work / "otel-sessions", registry=registry, tools=AgentToolSurface(AgentApprovals())
                    )
                )
                sessions = {name: (await runner.create_session("f")).id for name in clients}

                def turn(name: str) -> Callable[[], Awaitable[Any]]:
                    async def run() -> Any:
                        return await (await runner.run_turn(sessions[name], "hi")).wait(10)

                    return run

                for call in ("no_tool_turn", "unit_list"):
                    sides = {
                        name: turn(name) if call == "no_tool_turn" else partial(clients[name].call_tool, "unit_list")
                        for name in clients
                    }
                    for name, fn in sides.items():
                        side(name)
                        for _ in range(5):
                            await fn()
                        samples[f"{call}_{name}"], cpu[f"{call}_{name}"] = [], []
                    order = list(sides.items())
                    for turn_no in range(rounds):  # each side first in turn: what one call leaves runs in the next
                        for name, fn in order[turn_no % 3 :] + order[: turn_no % 3]:
                            side(name)
                            started, started_cpu = time.perf_counter(), time.process_time()
                            await fn()
                            cpu[f"{call}_{name}"].append((time.process_time() - started_cpu) * 1000)
                            samples[f"{call}_{name}"].append((time.perf_counter() - started) * 1000)
                            exporter.clear()
                side("off")
        provider.shutdown()
        figures: dict[str, Any] = {k: summary(v) for k, v in samples.items()}
        figures |= {f"{k}_cpu": summary(v) for k, v in cpu.items()}
        ratios = []
        for call in ("no_tool_turn", "unit_list"):
            for clock in ("", "_cpu"):
                what = "wall" if not clock else "CPU"
                ratios.append(
                    ratio_row(
                        f"{call} ({what}): tracing off (no provider) / our spans bypassed (before issue 39)",
                        figures[f"{call}_off{clock}"],
                        figures[f"{call}_before{clock}"],
                        1.02,
                    )
                )
                ratios.append(
                    ratio_row(
                        f"{call} ({what}): tracing on (SDK, in-memory exporter) / off",
                        figures[f"{call}_on{clock}"],
                        figures[f"{call}_off{clock}"],
                        None,
                    )
                )
        self.record("otel", figures, ratios)

    async def checkpoints(self) -> None:
        """Checkpoints that hold every source (issue 36): one of 10,000 units (1 KB each) taken cold, then again
        with nothing changed (time, and bytes added to the blob store); a rollback of 100 sources against the 100
        unit_apply_patch calls it undoes. Each part stops at its time bound (rounds not reached are not run)."""
        count, budget = (1_000, 30.0) if self.quick else (10_000, 120.0)
        root = self.work / "checkpoint-units"
        make_units(root, count, body="".join(f"def f{j}(x):\n    return x * {j} + 1\n\n" for j in range(30)))
        figures: dict[str, Any] = {}
        with Host(root, self.work / "checkpoint-data", namespace="bench_checkpoints", app_log=False) as host:
            service = UnitService(host)
            started = time.perf_counter()
            cold = service.checkpoint(label="cold")
            figures["checkpoint_cold_ms"] = round((time.perf_counter() - started) * 1000, 1)
            figures["checkpoint_cold_bytes_added"] = cold.bytes_added
            figures["units"], figures["sources"] = cold.units, cold.sources
            blobs_before = host.changes.blob_usage()  # type: ignore[attr-defined]
            db = self.work / "checkpoint-data" / "changes.db"
            size_before = sqlite_bytes(db)
            unchanged, added = [], []
            deadline = time.monotonic() + budget / 2
            while len(unchanged) < (3 if self.quick else 10) and time.monotonic() < deadline:
                started = time.perf_counter()
                again = service.checkpoint(label="unchanged")
                unchanged.append((time.perf_counter() - started) * 1000)
                added.append(again.bytes_added)
            figures["checkpoint_unchanged"] = summary(unchanged)
            figures["checkpoint_unchanged_bytes_added_max"] = max(added)
            figures["blob_store_bytes"] = host.changes.blob_usage()[1]  # type: ignore[attr-defined]
            figures["blob_store_unchanged_growth"] = host.changes.blob_usage()[1] - blobs_before[1]  # type: ignore[attr-defined]
            size_after = sqlite_bytes(db)
            figures["changes_db_bytes"] = size_after
            figures["changes_db_growth_per_unchanged_checkpoint_bytes"] = round(
                (size_after - size_before) / max(1, len(unchanged))
            )
            patches, rollbacks = [], []
            units = [f"unit_{n:05d}" for n in range(100)]
            deadline = time.monotonic() + budget / 2
            while len(rollbacks) < (3 if self.quick else 10) and time.monotonic() < deadline:
                mark = service.checkpoint(label="before 100 patches", unit_ids=units)
                started = time.perf_counter()
                for unit_id in units:
                    service.apply_patch(unit_id, f"{unit_id}.py", old="return x * 0 + 1", new="return x * 0 + 2")
                patches.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                undone = service.rollback(mark.checkpoint_id)
                rollbacks.append((time.perf_counter() - started) * 1000)
                assert len(undone.sources) == 100 and not undone.conflicts
            figures["unit_apply_patch_x100"] = summary(patches)
            figures["unit_rollback_100_sources"] = summary(rollbacks)
        self.record(
            "checkpoints",
            figures,
            [
                ratio_row(
                    "unit_rollback of 100 sources / the 100 unit_apply_patch calls it undoes",
                    figures["unit_rollback_100_sources"],
                    figures["unit_apply_patch_x100"],
                    None,
                ),
            ],
        )

    async def sessions(self) -> None:
        """The agent session store: one append at 10 and at 10,000 items; on SQLite and on PostgreSQL, the first
        page of a store of 10,000 sessions against one of 10, and loading a 10,000-item session
        (scripts/bench_sessions.py)."""
        sys.path.insert(0, str(REPO / "scripts"))
        from bench_sessions import load_ms, median_append_us, paging_ms

        appends = 100 if self.quick else 300
        figures: dict[str, Any] = {}
        ratios = []
        for durability in ("always", "flush"):
            for size in (10, 10_000):
                folder = self.work / f"sessions-{durability}-{size}"
                median, p90 = await anyio.to_thread.run_sync(median_append_us, folder, size, durability, appends)
                figures[f"append_{durability}_{size}_items"] = {"median_us": round(median, 1), "p90_us": round(p90, 1)}
            value = (
                figures[f"append_{durability}_10000_items"]["median_us"]
                / figures[f"append_{durability}_10_items"]["median_us"]
            )
            ratios.append(
                {
                    "ratio": f"session append ({durability}) 10000/10 items",
                    "value": round(value, 3),
                    "goal": "<= 1.5",
                    "met": value <= 1.5,
                }
            )
        stores: dict[str, Callable[[str], Path | str]] = {
            "sqlite": lambda name: self.work / name,
            "postgres": lambda name: self.cluster().new_database(),
        }
        for database, store in stores.items():
            pages = await anyio.to_thread.run_sync(paging_ms, store(f"list-10-{database}"), store(f"list-{database}"))
            loaded, cpu = await anyio.to_thread.run_sync(load_ms, store(f"load-{database}"), 10_000)
            figures[f"page_of_10_{database}_ms"] = {name: round(value, 3) for name, value in pages.items()}
            few, many = pages["of_10"], max(pages["first_of_10000"], pages["last_of_10000"])
            figures[f"load_10000_items_{database}_ms"] = {"wall": round(loaded, 2), "cpu": round(cpu, 2)}
            ratios.append(
                {
                    "ratio": f"a page of 10 sessions ({database}) 10,000/10 sessions in the store (its slower page)",
                    "value": round(many / few, 3),
                    "goal": "<= 2",
                    "met": many / few <= 2,
                }
            )
            ratios.append(
                {
                    "ratio": f"load a 10,000-item session ({database}), ms",
                    "value": round(loaded, 2),
                    "goal": "<= 100",
                    "met": loaded <= 100,
                }
            )
        self.record("sessions", figures, ratios)

    async def _saturate(
        self, bridge: Bridge, clients: int, seconds: float, *, lean: bool, call: list[Any] = READ_20KB
    ) -> tuple[list[dict[str, Any]], float]:
        """`clients` client processes (`--client`, or `--lean-client`) calling `call` on `bridge` from the same instant
        for `seconds`: their counts, and this process's CPU meanwhile (it is the server)."""
        option = "--lean-client" if lean else "--client"
        argv = [sys.executable, __file__, option, str(bridge.url), str(seconds)]
        env = {**os.environ, CLIENT_TOKEN: bridge.token or "", CALL: json.dumps(call)}  # a token may start with "-"
        async with AsyncExitStack() as stack:
            procs = [
                await stack.enter_async_context(await anyio.open_process(argv, stderr=None, env=env))
                for _ in range(clients)
            ]
            lines = []
            for proc in procs:
                assert proc.stdout is not None
                lines.append(BufferedByteReceiveStream(proc.stdout))
            for line in lines:  # each client says when it is connected
                await line.receive_until(b"\n", 1 << 16)
            begin = f"{time.time() + 0.2}\n".encode()
            for proc in procs:
                assert proc.stdin is not None
                await proc.stdin.send(begin)
            await anyio.sleep(0.2)
            cpu_before = time.process_time()
            counts = []
            for proc, line in zip(procs, lines, strict=True):
                counts.append(json.loads(await line.receive_until(b"\n", 1 << 16)))
                await proc.wait()
            return counts, time.process_time() - cpu_before

    async def concurrency(self) -> None:
        """Calls per second with 1 and with 16 clients, each client its own process (`--client`), so the clients'
        CPU is not the server's. Every client connects first, then all call from the same instant for `seconds`."""
        root = self.work / "conc-units"
        twenty_kb_unit(root)
        seconds = 2.0 if self.quick else 8.0
        figures: dict[str, Any] = {}
        with Host(root, self.work / "conc-data", namespace="bench_conc") as host:
            tools = UnitTools(UnitService(host))
            async with Bridge(tools.server(), config_root=self.work / "cfg-conc") as bridge:
                for kind, clients in (("", 1), ("", 16), ("lean_", 1), ("lean_", 16)):
                    counts, server_cpu = await self._saturate(bridge, clients, seconds, lean=bool(kind))
                    calls = sum(c["calls"] for c in counts)
                    figures[f"{kind}calls_per_second_{clients}_clients"] = round(calls / seconds, 1)
                    figures[f"{kind}errors_{clients}_clients"] = sum(c["errors"] for c in counts)
                    figures[f"{kind}server_cpu_ms_per_call_{clients}_clients"] = round(
                        server_cpu * 1000 / max(calls, 1), 3
                    )
                    figures[f"{kind}server_cpu_share_of_one_core_{clients}_clients"] = round(server_cpu / seconds, 2)
                    client_cpu = sum(c["cpu"] for c in counts)
                    figures[f"{kind}client_cpu_ms_per_call_{clients}_clients"] = round(
                        client_cpu * 1000 / max(calls, 1), 3
                    )
        value = figures["calls_per_second_16_clients"] / figures["calls_per_second_1_clients"]
        lean = figures["lean_calls_per_second_16_clients"] / figures["lean_calls_per_second_1_clients"]
        self.record(
            "concurrency",
            figures,
            [{"ratio": "calls/s 16 clients / 1 client (clients in separate processes)", "value": round(value, 3),
              "goal": ">= 1.5", "met": value >= 1.5},
             {"ratio": "the same with lean HTTP clients (plain keep-alive POSTs, not the SDK client)",
              "value": round(lean, 3)}],
        )  # fmt: skip

    async def tests(self) -> None:
        root = self.work / "tests-units"
        (root / "trivial").mkdir(parents=True)
        (root / "trivial" / "__init__.py").write_text("")
        (root / "trivial" / "test_init.py").write_text("def main():\n    return True\n")
        with Host(root, self.work / "tests-data", namespace="bench_tests") as host:
            service = UnitService(host)
            samples = await interleaved(
                {
                    "unit_run_tests_trivial": lambda: anyio.to_thread.run_sync(lambda: service.run_tests("trivial")),
                    "python_c_pass": lambda: anyio.run_process([sys.executable, "-c", "pass"]),
                },
                15 if self.quick else 40,
                warmup=2,
            )
        figures = {k: summary(v) for k, v in samples.items()}
        sys.path.insert(0, str(REPO / "scripts"))
        from bench_long_calls import measure

        figures["unit_run_tests_wait_false"] = summary(await measure(15 if self.quick else 40))
        p95 = figures["unit_run_tests_wait_false"]["p95_ms"]
        self.record(
            "tests",
            figures,
            [
                ratio_row(
                    "unit_run_tests(trivial) / python -c pass",
                    figures["unit_run_tests_trivial"],
                    figures["python_c_pass"],
                    1.5,
                ),
                {"ratio": "unit_run_tests(wait=false) answer, p95 ms (in-memory SDK client)", "value": p95,
                 "goal": "<= 50", "met": p95 <= 50},
            ],
        )  # fmt: skip

    async def durable(self) -> None:
        """Durable turns (unit-mcp[durable]): the cost of a step against the plain runner, the same turn (ten tool
        calls, eleven model requests) interleaved turn by turn on a scripted model, on a SQLite and on a PostgreSQL
        system database (the tests' cluster: fsync off); and how long a live worker takes to resume the turn of a
        worker SIGKILLed mid-turn (kill to the resumed model request)."""
        from dbos import DBOS

        async def nothing() -> None:
            return None

        @DBOS.workflow(name="bench.bare_steps")
        async def bare_steps(count: int) -> list[float]:
            """DBOS's own cost of a step (a no-op checkpointed), for context."""
            spent = []
            for _ in range(count):
                started = time.perf_counter()
                await DBOS.run_step_async({"name": "nothing"}, nothing)
                spent.append((time.perf_counter() - started) * 1000)
            return spent

        calls, rounds = 10, 5 if self.quick else 20
        steps = 2 * calls + 1
        figures: dict[str, Any] = {}
        ratios: list[dict[str, Any]] = []
        for which, system_db in [("sqlite", None), ("postgres", self.cluster().new_database())]:
            samples = await self._durable_steps(which, system_db, calls, rounds, bare_steps)
            plain_turn, durable_turn = summary(samples["plain"]), summary(samples["durable"])
            overhead = (durable_turn["median_ms"] - plain_turn["median_ms"]) / steps
            suffix = "" if which == "sqlite" else "_postgres"
            figures |= {
                f"plain_turn_{steps}_steps{suffix}": plain_turn,
                f"durable_turn_{steps}_steps{suffix}": durable_turn,
                f"dbos_part_of_a_turn_step_{which}": summary(samples["machinery"]),
                f"bare_dbos_step_{which}": summary(samples["bare"]),
            }
            ratios.append(
                {
                    "ratio": "durable step overhead over the plain runner (ms per step, "
                    + ("SQLite)" if which == "sqlite" else "PostgreSQL, fsync off)"),
                    "value": round(overhead, 3),
                    "goal": "<= 3",
                    "met": overhead <= 3,
                }
            )
        recovery = summary(await self._durable_recovery(2 if self.quick else 5))
        figures["recovery_on_a_live_worker"] = recovery
        ratios.append(
            {
                "ratio": "a killed worker's turn resumed on a live worker (seconds, median)",
                "value": round(recovery["median_ms"] / 1000, 3),
                "goal": "<= 2",
                "met": recovery["median_ms"] <= 2000,
            }
        )
        self.record("durable", figures, ratios)

    async def _durable_steps(
        self, which: str, system_db: str | None, calls: int, rounds: int, bare_steps: Callable[[int], Awaitable[Any]]
    ) -> dict[str, list[float]]:
        """Turn times (ms) of the plain runner and of a durable worker on `system_db` (None: SQLite in the data
        folder), interleaved; the durable turns' steps less their bodies (DBOS's own part, which turn times on a
        loaded machine drown); and bare DBOS steps on that database after them."""
        from dbos import DBOS

        from unit_mcp.agent import (
            AgentApprovals,
            AgentRegistry,
            AgentRunner,
            AgentToolSurface,
            DurableWorker,
            OpenAIAgent,
            SessionStore,
        )
        from unit_mcp.testing import ScriptedModel, call, say, tool_call

        turn = [*(call(tool_call("noop", {})) for _ in range(calls)), say("done")]
        surface = AgentToolSurface(AgentApprovals())

        @surface.tool
        def noop() -> str:
            return "ok"

        folder = self.work / f"durable-steps-{which}"
        async with ScriptedModel(turn * (2 * rounds + 2)) as model:
            registry = AgentRegistry()
            agent = OpenAIAgent(id="bench", model="scripted", base_url=model.base_url, stream=False, max_steps=50)
            registry.register("bench", lambda deps: agent)
            store = SessionStore(folder / "sessions")
            worker = DurableWorker(
                store=store, registry=registry, tools=surface, data_dir=folder, system_database_url=system_db
            )
            async with AgentRunner(store=store, registry=registry, tools=surface) as runner, worker:

                async def plain() -> None:
                    session = await runner.create_session("bench")
                    handle = await runner.run_turn(session.id, "go")
                    await handle.wait()
                    await anyio.to_thread.run_sync(store.invalidate, session.id)

                async def durable() -> None:
                    session = await anyio.to_thread.run_sync(store.create, "bench")
                    assert await worker.wait(await worker.submit(session.id, "go")) == "done"

                machinery: list[float] = []
                with patch.object(DBOS, "run_step_async", partial(timed_step, DBOS.run_step_async, machinery)):
                    samples = await interleaved({"plain": plain, "durable": durable}, rounds, warmup=1)
                samples["machinery"] = machinery
                samples["bare"] = await bare_steps((2 * calls + 1) * rounds)
            store.close()
        return samples

    async def _durable_recovery(self, rounds: int) -> list[float]:
        """Milliseconds from SIGKILLing the worker that runs a turn (inside a model request) to the replayed
        request arriving from the other worker (`worker --takeover`, SQLite system database)."""
        from unit_mcp.agent import DurableClient, SessionStore
        from unit_mcp.testing import ScriptedModel, say

        data = self.work / "durable-recovery"
        data.mkdir(mode=0o700)
        found: list[float] = []
        async with ScriptedModel([say("never", delay=600), say("resumed")] * rounds) as model:
            options = ["--model", "scripted", "--base-url", model.base_url]
            workers: dict[str, subprocess.Popen[bytes]] = {}
            count = 0

            async def start() -> None:
                nonlocal count
                count += 1
                name = f"w{count}"
                log = data.parent / f"{name}.log"
                with log.open("wb") as out:
                    workers[name] = subprocess.Popen(
                        [sys.executable, "-m", "unit_mcp.agent", "--data-dir", str(data), "worker", *options,
                         "--executor-id", name, "--takeover"],
                        cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                    )  # fmt: skip
                with anyio.fail_after(60):
                    while f"worker {name} runs durable turns".encode() not in log.read_bytes():
                        await anyio.sleep(0.05)

            store = SessionStore(data)
            try:
                await start()
                await start()
                system_db = f"sqlite:///{data.resolve() / 'dbos.sqlite'}"  # the workers' default (docs/durable.md)
                async with DurableClient(system_db) as client:
                    for _ in range(rounds):
                        asked = len(model.requests)
                        session = await anyio.to_thread.run_sync(store.create, "unit-agent")
                        turn_id = await client.submit(store, session.id, "go")
                        with anyio.fail_after(60):
                            while len(model.requests) == asked:
                                await anyio.sleep(0.01)
                        status = await (await client.client.retrieve_workflow_async(turn_id)).get_status()
                        killed = time.time()
                        dead = workers.pop(status.executor_id)
                        dead.kill()
                        await anyio.to_thread.run_sync(dead.wait)  # reaped, as its supervisor would
                        with anyio.fail_after(60):
                            while len(model.requests) == asked + 1:
                                await anyio.sleep(0.01)
                        found.append((model.requests[-1].received_at - killed) * 1000)
                        with anyio.fail_after(60):
                            assert await client.wait(turn_id) == "resumed"
                        await start()
            finally:
                for process in workers.values():
                    process.kill()
                    process.wait()
                store.close()
        return found


async def timed_step(
    run_step: Callable[..., Awaitable[Any]],
    spent: list[float],
    options: Any,
    func: Callable[..., Awaitable[Any]],
    *args: Any,
    **kwargs: Any,
) -> Any:
    """`DBOS.run_step_async`, keeping the step's time less its body's (ms) in `spent`."""
    body: list[float] = []

    async def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await func(*args, **kwargs)
        finally:
            body.append(time.perf_counter() - started)

    started = time.perf_counter()
    try:
        return await run_step(options, timed, *args, **kwargs)
    finally:
        spent.append((time.perf_counter() - started - sum(body)) * 1000)


def bulk_changes(log: SqliteChangeLog, count: int) -> None:
    """`count` one-source records of 100 units (a 200-byte source each): a log to read."""
    data = b"x = 1\n" * 34
    for n in range(count):
        unit_id = f"unit_{n % 100}"
        log.record(
            caller=NOBODY, tool="unit_apply_patch", unit_id=unit_id, source_id="__init__.py", outcome="applied",
            sources=[SourceChange(unit_id, "__init__.py", "modified", "sha256:0", "sha256:1", data, data)],
        )  # fmt: skip


def _merge_tally(a: Any, b: Any) -> Any:
    """Two tallies of the edit corpus added up (`a` may be None)."""
    if a is None:
        return b
    for field in vars(b):
        if field == "detail_bytes_max":
            a.detail_bytes_max = max(a.detail_bytes_max, b.detail_bytes_max)
        else:
            setattr(a, field, getattr(a, field) + getattr(b, field))
    return a


def merged(results: dict[str, Any]) -> dict[str, Any]:
    """This run's sections folded into the written report's (`--merge`): its sections and ratios replace theirs."""
    before = json.loads((OUT / "results.json").read_text())
    ran = set(results["sections"])
    before["sections"].update(results["sections"])
    before["ratios"] = [r for r in before["ratios"] if r["section"] not in ran] + results["ratios"]
    earlier = [
        note
        for note in before.get("merged", "").split("; ")
        if note and not set(note.split(" from ")[0].split(", ")) <= ran
    ]
    before["merged"] = "; ".join(
        [*earlier, f"{', '.join(sorted(ran))} from a run at {results['when']} ({results['load']})"]
    )
    return before


HAND_NOTES = "\n## Notes kept by hand\n"
"""RESULTS.md from this heading on is written by people (analysis, history) and kept by every run."""


def write_report(results: dict[str, Any], command: str) -> None:
    OUT.mkdir(exist_ok=True)
    old = (OUT / "RESULTS.md").read_text() if (OUT / "RESULTS.md").exists() else ""
    kept = old[old.index(HAND_NOTES) :] if HAND_NOTES in old else ""
    (OUT / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "# Benchmark results",
        "",
        f"Made by `{command}` on {results['machine']} at {results['when']} ({results['load']}).",
        *([f"Merged in: {results['merged']}."] if "merged" in results else []),
        "Both sides of each ratio were measured interleaved in the same run; absolute times are context only.",
        "",
        "| section | ratio | value | goal | met |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in results["ratios"]:
        lines.append(
            f"| {row['section']} | {row['ratio']} | {row['value']} | {row.get('goal', '')} | {row.get('met', '')} |"
        )
    lines += ["", "## Figures", ""]
    for section, figures in results["sections"].items():
        lines.append(f"### {section}")
        lines.append("")
        for name, value in figures.items():
            lines.append(f"- {name}: {value}")
        lines.append("")
    (OUT / "RESULTS.md").write_text("\n".join(lines) + kept)


async def client_loop(url: str, token: str, seconds: float) -> None:
    """One benchmark client process: connect, say so, read the start time (wall clock) from stdin, call the tool
    named in UNIT_MCP_BENCH_CALL (a 20 KB unit_read_source by default) from then for `seconds`, print its counts as
    one JSON line."""
    calls = errors = 0
    async with http_client(url, token or None) as client:
        print("connected", flush=True)
        begin = float(await anyio.to_thread.run_sync(sys.stdin.readline))
        await anyio.sleep(max(0.0, begin - time.time()))
        end = begin + seconds
        cpu = time.process_time()
        name, arguments = json.loads(os.environ.get(CALL) or json.dumps(READ_20KB))
        while time.time() < end:
            result = await client.call_tool(name, arguments)
            calls += 1
            errors += bool(result.is_error)
        cpu = time.process_time() - cpu
    print(json.dumps({"calls": calls, "errors": errors, "cpu": cpu}), flush=True)


def lean_client_loop(url: str, token: str, seconds: float) -> None:
    """`client_loop` with a plain HTTP/1.1 keep-alive connection instead of the SDK's client: the handshake-era
    initialize, then `tools/call` POSTs whose JSON answers are parsed and checked, nothing else. It spends a
    fraction of the SDK client's CPU per call, so 16 of them leave the server the CPU it can use."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port)
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer {token}",
    }

    def post(message: dict[str, Any]) -> tuple[http.client.HTTPResponse, bytes]:
        try:
            conn.request("POST", parts.path, json.dumps(message), headers)
            response = conn.getresponse()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            conn.close()  # the server closed the idle connection while the other clients started: connect again
            conn.request("POST", parts.path, json.dumps(message), headers)
            response = conn.getresponse()
        return response, response.read()

    hello = {
        "protocolVersion": LATEST_HANDSHAKE_VERSION,
        "capabilities": {},
        "clientInfo": {"name": "b", "version": "0"},
    }
    response, _ = post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello})
    headers["Mcp-Session-Id"] = response.getheader("mcp-session-id") or ""
    headers["Mcp-Protocol-Version"] = LATEST_HANDSHAKE_VERSION
    post({"jsonrpc": "2.0", "method": "notifications/initialized"})
    print("connected", flush=True)
    begin = float(sys.stdin.readline())
    time.sleep(max(0.0, begin - time.time()))
    end = begin + seconds
    calls = errors = 0
    cpu = time.process_time()
    name, arguments = json.loads(os.environ.get(CALL) or json.dumps(READ_20KB))
    while time.time() < end:
        calls += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": calls, "method": "ping"}
        if name != "ping":  # MCP's own no-op request, answered by the server without any tool
            message |= {"method": "tools/call", "params": {"name": name, "arguments": arguments}}
        response, body = post(message)
        answer = json.loads(body) if response.status == 200 else {}
        errors += bool(answer.get("error") or "result" not in answer or answer["result"].get("isError"))
    cpu = time.process_time() - cpu
    print(json.dumps({"calls": calls, "errors": errors, "cpu": cpu}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", action="store_true", help="write bench/ even for a quick or partial run")
    parser.add_argument(
        "--merge", action="store_true", help="fold this run's sections into the written bench/ report (a partial run)"
    )
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated subset of {', '.join(SECTIONS)}, or of the opt-in {', '.join(OPT_IN)}",
    )
    parser.add_argument(
        "--section-seconds",
        type=float,
        default=SECTION_SECONDS,
        help=f"each section's time bound; one still running then is reported as a hang (default {SECTION_SECONDS:g})",
    )
    parser.add_argument("--client", nargs=2, metavar=("URL", "SECONDS"), help=argparse.SUPPRESS)
    parser.add_argument("--lean-client", nargs=2, metavar=("URL", "SECONDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        url, seconds = args.client
        anyio.run(client_loop, url, os.environ.get(CLIENT_TOKEN, ""), float(seconds))
        return
    if args.lean_client:
        url, seconds = args.lean_client
        lean_client_loop(url, os.environ.get(CLIENT_TOKEN, ""), float(seconds))
        return
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(chosen) - set(SECTIONS) - set(OPT_IN)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="unit-mcp-bench-") as tmp:
        bench = Bench(args, Path(tmp))

        async def run() -> None:
            for section in chosen:
                await bench.bounded(section, args.section_seconds)

        try:
            anyio.run(run)
        finally:
            if bench._cluster is not None:
                bench._cluster.close()
    bench.results["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    bench.results["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    bench.results["load"] = f"load average {load_before:.1f} before the run, {os.getloadavg()[0]:.1f} after"
    if args.merge:
        command = json.loads((OUT / "results.json").read_text()).get("command", "scripts/bench.py")
        write_report(merged(bench.results), command)
        print(f"\nmerged into: {OUT / 'RESULTS.md'} and {OUT / 'results.json'}")
        return
    if (args.quick or set(chosen) != set(SECTIONS)) and not args.write:
        print(f"\nquick or partial run: {OUT / 'RESULTS.md'} left as it was (--write replaces it)")
        return
    command = "scripts/bench.py " + " ".join(sys.argv[1:])
    bench.results["command"] = command.strip()
    write_report(bench.results, command.strip())
    print(f"\nwritten: {OUT / 'RESULTS.md'} and {OUT / 'results.json'}")


if __name__ == "__main__":
    main()
