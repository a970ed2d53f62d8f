"""Server CPU per call under the hardening load test's mix of calls, for two versions of unit_mcp side by side.

    .venv/bin/python scripts/bench_percall.py --base 0deba14            # that commit against this work tree
    .venv/bin/python scripts/bench_percall.py --base HEAD --rounds 6 --seconds 3 --clients 8
    .venv/bin/python scripts/bench_percall.py --base 0deba14 --rounds 3 --per-kind 150   # each kind of call alone
    .venv/bin/python scripts/bench_percall.py --base HEAD --rounds 5 --sdk 100    # one call at a time, SDK client

Each side is a real `python -m unit_mcp.server` child (watching its units, as the load test runs it): the base
side imports `unit_mcp` exported from the `--base` commit, the other side this work tree's. Lean client processes
(plain keep-alive POSTs, so the clients' CPU is small) send the load test's mix (tests/support/load_mix.py): 35 % a read
then a hash-checked patch of a tally unit, the rest reads, lists, inspects, snapshots, log reads, resolves,
reloads and dry runs. The sides take turns, round by round, so drift on this shared machine hits both alike.
The figure is the server's user+system CPU (from /proc) over the calls it answered, with the calls per second and each
tool's mean latency. Prints figures only; bench/RESULTS.md has the figures that were kept.

`--sdk CALLS` asks where the wall time of one call goes instead: this process calls, one call at a time, through the
SDK's own `mcp.Client` over Streamable HTTP, `unit_list` (and `unit_list` with an invalid argument) on both sides,
and a trivial tool on two bare SDK servers: the SDK's own Starlette app on uvicorn (answering each POST with one
JSON body, as ours does when no progress is asked), and the same server behind this work tree's `McpHttpServer`
(token, guard, joined writes). Per call: the median wall time, the client's CPU, the time the client spent
checking the result against the tool's output schema, and the server's CPU. Each turn also
opens three new sessions: "session" is the handshake, "first call" the first call in it (the client lists the tools
and compiles the output schema's validator there).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.load_mix import EDIT, KINDS, copy_units, cpu_seconds, home_of, next_call, tally_patch  # noqa: E402

HANDSHAKE = "2025-11-25"


class McpSession:
    """One MCP session over one keep-alive connection, answered as JSON bodies (no progress asked)."""

    def __init__(self, url: str, token: str) -> None:
        parts = urlsplit(url)
        self.path = parts.path
        self.conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port)
        self.headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {token}",
        }
        self.ids = 0
        self.waited: dict[str, list[float]] = {}
        """Calls and the seconds they took, by tool name."""
        hello = {"protocolVersion": HANDSHAKE, "capabilities": {}, "clientInfo": {"name": "percall", "version": "0"}}
        response, _ = self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello})
        self.headers["Mcp-Session-Id"] = response.getheader("mcp-session-id") or ""
        self.headers["Mcp-Protocol-Version"] = HANDSHAKE
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def post(self, message: dict[str, Any]) -> tuple[http.client.HTTPResponse, bytes]:
        try:
            self.conn.request("POST", self.path, json.dumps(message), self.headers)
            response = self.conn.getresponse()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            self.conn.close()  # the server closed the connection while this side rested: connect again
            self.conn.request("POST", self.path, json.dumps(message), self.headers)
            response = self.conn.getresponse()
        return response, response.read()

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self.ids += 1
        params = {"name": name, "arguments": arguments}
        started = time.perf_counter()
        response, body = self.post({"jsonrpc": "2.0", "id": self.ids, "method": "tools/call", "params": params})
        waited = self.waited.setdefault(name, [0, 0.0])
        waited[0] += 1
        waited[1] += time.perf_counter() - started
        if response.status != 200:
            raise RuntimeError(f"{name}: HTTP {response.status}: {body[:200]!r}")
        answer = json.loads(body)
        if "error" in answer:
            raise RuntimeError(f"{name}: {answer['error']}")
        result: dict[str, Any] = answer["result"]
        return result


def step(session: McpSession, rng: random.Random, home: str, kind: str | None = None) -> tuple[int, int]:
    """One step of the load test's mix (or of one `kind` of it): (calls made, unexpected errors)."""
    name, arguments = next_call(rng, home, None if kind is None else KINDS[kind])
    if name == EDIT:
        read = session.call("unit_read_source", arguments)
        result = session.call("unit_apply_patch", tally_patch(home, read["structuredContent"]))
        stale = result.get("isError") and "[stale_hash]" in result["content"][0]["text"]
        return 2, int(bool(result.get("isError")) and not stale)
    return 1, int(bool(session.call(name, arguments).get("isError")))


def client(number: int, targets: dict[str, tuple[str, str]]) -> None:
    """A client process: one session per side; each stdin line `SIDE SECONDS CALLS [KIND]` runs the mix (or steps of
    one kind) against that side for SECONDS or until CALLS calls (whichever is not 0) and answers
    `{"calls": …, "errors": …, "waited": …}`. Each side gets the same sequence of steps."""
    mcp_sessions = {side: McpSession(url, token) for side, (url, token) in targets.items()}
    rngs, home = {side: random.Random(number) for side in targets}, home_of(number)
    print("connected", flush=True)
    for line in sys.stdin:
        side, seconds, most, *kind = line.split()
        calls = errors = 0
        mcp_sessions[side].waited = {}
        end = time.monotonic() + float(seconds)
        while (time.monotonic() < end) if float(seconds) else calls < int(most):
            made, failed = step(mcp_sessions[side], rngs[side], home, *kind)
            calls, errors = calls + made, errors + failed
        print(json.dumps({"calls": calls, "errors": errors, "waited": mcp_sessions[side].waited}), flush=True)


def start_server(work: Path, side: str, pythonpath: str | None) -> tuple[subprocess.Popen[str], str, str]:
    units = work / side / "units"
    copy_units(units)
    env = dict(os.environ, TMPDIR=str(work / side))
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "unit_mcp.server",
            "--units",
            str(units),
            "--data-dir",
            str(work / side / "data"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=work / side,
    )
    return read_address(server, side)


FRESH = 3
"""Fresh sessions a turn of `--sdk`: how long a new session takes to connect and to answer its first call."""
BARE_SIDES = ("sdk", "bridge")
"""Bare servers of `--sdk`: one trivial tool on the SDK's own app, and on unit_mcp's `McpHttpServer`."""
SDK_CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "unit_list": ("unit_list", {}),
    "invalid": ("unit_list", {"bogus": 1}),
    "trivial": ("ping", {}),
}


def bare_server(kind: str) -> None:
    """A bare SDK server with one trivial tool on loopback, printing MCP_URL= and MCP_TOKEN= as the unit server."""
    import uvicorn
    from mcp.server.mcpserver import MCPServer

    from unit_mcp.loopback import bind_loopback
    from unit_mcp.mcphttp import McpHttpServer

    server = MCPServer(name="bare", log_level="WARNING")

    @server.tool(name="ping")
    def ping() -> str:
        return "pong"

    async def serve() -> None:
        if kind == "bridge":
            http = McpHttpServer()
            await http.start(server._lowlevel_server)
            print(f"MCP_URL={http.url}\nMCP_TOKEN={http.token}", flush=True)
            await asyncio.Event().wait()
        sock = bind_loopback("127.0.0.1", 0)
        print(f"MCP_URL=http://127.0.0.1:{sock.getsockname()[1]}/mcp\nMCP_TOKEN=", flush=True)
        config = uvicorn.Config(server.streamable_http_app(json_response=True), log_level="warning")
        await uvicorn.Server(config).serve(sockets=[sock])

    asyncio.run(serve())


def read_address(server: subprocess.Popen[str], side: str) -> tuple[subprocess.Popen[str], str, str]:
    """The server and the MCP_URL and MCP_TOKEN it printed."""
    printed: dict[str, str] = {}
    assert server.stdout is not None
    while "MCP_TOKEN" not in printed or "MCP_URL" not in printed:
        line = server.stdout.readline()
        if not line:
            raise RuntimeError(f"the {side} server exited before it listened")
        key, _, value = line.rstrip("\n").partition("=")
        printed[key] = value
    return server, printed["MCP_URL"], printed["MCP_TOKEN"]


async def sdk_calls(
    servers: dict[str, tuple[subprocess.Popen[str], str, str]], calls: int, rounds: int, mode: str
) -> dict[tuple[str, str], dict[str, list[float]]]:
    """`calls` calls of each kind on each side per round, sides in turn; per (side, kind) each call's wall, client
    CPU and schema check, and each turn's server CPU (seconds; /proc counts it in ticks, so a turn's total)."""
    import httpx2
    from mcp import Client
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    checking = [0.0]
    check = ClientSession.validate_tool_result

    async def timed_check(self: ClientSession, name: str, result: Any) -> None:
        started = time.perf_counter()
        try:
            await check(self, name, result)
        finally:
            checking[0] += time.perf_counter() - started

    ClientSession.validate_tool_result = timed_check  # type: ignore[method-assign]
    figures: dict[tuple[str, str], dict[str, list[float]]] = {}

    def record(side: str, kind: str, walls: list[float], cpus: list[float], checks: list[float], *cpu: float) -> None:
        figure = figures.setdefault((side, kind), {"wall": [], "cpu": [], "check": [], "server": []})
        figure["wall"] += walls
        figure["cpu"] += cpus
        figure["check"] += checks
        figure["server"] += cpu

    async def fresh(side: str, kind: str, counted: bool) -> None:
        """`FRESH` new sessions, each timed to its handshake's end ("session") and through its first call; the
        server's CPU is that of the whole sessions (handshake, first call, closing), on the "session" row."""
        _, url, token = servers[side]
        name, arguments = SDK_CALLS[kind]
        times: dict[str, tuple[list[float], list[float], list[float]]] = {}
        server_cpu = cpu_seconds(servers[side][0].pid)
        for _ in range(FRESH):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            checking[0] = 0.0
            cpu, started = time.process_time(), time.perf_counter()
            async with (
                httpx2.AsyncClient(headers=headers) as http,
                Client(streamable_http_client(url, http_client=http), mode=mode) as session,
            ):
                for step in ("session", "first"):
                    if step == "first":
                        await session.call_tool(name, arguments)
                    walls, cpus, checks = times.setdefault(step, ([], [], []))
                    walls.append(time.perf_counter() - started)
                    cpus.append(time.process_time() - cpu)
                    checks.append(checking[0])
                    checking[0] = 0.0
                    cpu, started = time.process_time(), time.perf_counter()
        if counted:
            walls, cpus, checks = times["session"]
            record(side, "session", walls, cpus, checks, cpu_seconds(servers[side][0].pid) - server_cpu)
            record(side, "first call", *times["first"])

    async with contextlib.AsyncExitStack() as stack:
        clients = {}
        for side, (_, url, token) in servers.items():
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            http = await stack.enter_async_context(httpx2.AsyncClient(headers=headers))
            transport = streamable_http_client(url, http_client=http)
            clients[side] = await stack.enter_async_context(Client(transport, mode=mode))
            await clients[side].list_tools()
        for round_ in range(rounds + 1):  # round 0 warms every side up and is not counted
            for side, client in clients.items():
                kinds = ["trivial"] if side in BARE_SIDES else ["unit_list", "invalid"]
                await fresh(side, kinds[0], bool(round_))
                for kind in kinds:
                    name, arguments = SDK_CALLS[kind]
                    walls, cpus, checks = [], [], []
                    server_cpu = cpu_seconds(servers[side][0].pid)
                    for _ in range(calls):
                        checking[0] = 0.0
                        cpu, started = time.process_time(), time.perf_counter()
                        result = await client.call_tool(name, arguments)
                        walls.append(time.perf_counter() - started)
                        cpus.append(time.process_time() - cpu)
                        checks.append(checking[0])
                        if result.is_error != (kind == "invalid"):
                            raise RuntimeError(f"{side} {name}: unexpected answer {result.content}")
                    if round_:
                        record(side, kind, walls, cpus, checks, cpu_seconds(servers[side][0].pid) - server_cpu)
    return figures


def sdk_main(args: argparse.Namespace, work: Path) -> None:
    """`--sdk`: the unit servers of both sides and the two bare servers, one SDK client calling them in turn."""
    servers = {
        "base": start_server(work, "base", str(work / "base-code")),
        "work": start_server(work, "work", None),
    }
    for kind in BARE_SIDES:
        bare = subprocess.Popen(
            [sys.executable, __file__, "--bare-server", kind], stdout=subprocess.PIPE, text=True, cwd=work
        )
        servers[kind] = read_address(bare, kind)
    try:
        figures = asyncio.run(sdk_calls(servers, args.sdk, args.rounds, args.mode))
    finally:
        for server, _, _ in servers.values():
            server.kill()
            server.wait()
    load = os.getloadavg()[0]
    print(f"base {args.base} against this work tree; the SDK's client ({args.mode} mode), one call at a time, ")
    print(f"{args.sdk} calls of each kind a turn, {args.rounds} rounds; load average {load:.1f} after; ms a call:")
    print("side      call        wall median  client CPU  schema check  server CPU (mean)")
    for (side, kind), figure in sorted(figures.items(), key=lambda item: list(servers).index(item[0][0])):
        wall, cpu, check = (1000 * statistics.median(figure[key]) for key in ("wall", "cpu", "check"))
        served = f"{1000 * sum(figure['server']) / len(figure['wall']):11.2f}" if figure["server"] else "          -"
        print(f"{side:9} {kind:11} {wall:11.2f} {cpu:11.2f} {check:13.2f} {served}")
    walls = {key: statistics.median(figure["wall"]) for key, figure in figures.items()}
    trivial = walls["sdk", "trivial"]
    print(f"  work unit_list / bare SDK trivial: {walls['work', 'unit_list'] / trivial:.2f}")
    print(f"  work invalid / bare SDK trivial: {walls['work', 'invalid'] / trivial:.2f}")
    print(f"  bridge trivial / bare SDK trivial: {walls['bridge', 'trivial'] / trivial:.2f}")
    print(f"  work / base unit_list: {walls['work', 'unit_list'] / walls['base', 'unit_list']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="HEAD", help="the commit to compare this work tree against")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0, help="of each side's turn in a round")
    parser.add_argument(
        "--per-kind",
        type=int,
        metavar="CALLS",
        help="instead of the mix: one client, CALLS steps of each kind a turn, the server's CPU per kind",
    )
    parser.add_argument(
        "--sdk",
        type=int,
        metavar="CALLS",
        help="instead of the mix: CALLS calls of each kind a turn from the SDK's client, one at a time, against the "
        "unit servers and two bare SDK servers; where the wall time of a call goes",
    )
    parser.add_argument("--mode", choices=["legacy", "auto"], default="legacy", help="the SDK client's era (--sdk)")
    parser.add_argument("--client", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--bare-server", choices=BARE_SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client is not None:
        client(args.client, json.loads(os.environ.pop("PERCALL_TARGETS")))
        return
    if args.bare_server is not None:
        bare_server(args.bare_server)
        return
    turns = [f"0 {args.per_kind} {kind}" for kind in KINDS] if args.per_kind else [f"{args.seconds} 0"]
    clients_count = 1 if args.per_kind else args.clients
    with tempfile.TemporaryDirectory(prefix="unit-mcp-percall-") as tmp:
        work = Path(tmp)
        (work / "base-code").mkdir()
        code = subprocess.run(
            ["git", "-C", str(REPO), "archive", args.base, "unit_mcp"], check=True, capture_output=True
        )
        subprocess.run(["tar", "-x", "-C", str(work / "base-code")], input=code.stdout, check=True)
        if args.sdk:
            sdk_main(args, work)
            return
        servers = {
            "base": start_server(work, "base", str(work / "base-code")),
            "work": start_server(work, "work", None),
        }
        for side, (server, _, _) in servers.items():
            print(f"{side} server: pid {server.pid}", file=sys.stderr, flush=True)  # for a profiler to attach
        totals = {
            (side, turn): {"calls": 0, "errors": 0, "cpu": 0.0, "wall": 0.0} for side in servers for turn in turns
        }
        latency: dict[str, dict[str, list[float]]] = {side: {} for side in servers}
        try:
            targets = json.dumps({side: (url, token) for side, (_, url, token) in servers.items()})
            clients = [
                subprocess.Popen(
                    [sys.executable, __file__, "--client", str(number)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env=dict(os.environ, PERCALL_TARGETS=targets),
                )
                for number in range(clients_count)
            ]
            for proc in clients:
                assert proc.stdout is not None and proc.stdout.readline().strip() == "connected"
            for round_ in range(args.rounds + 1):  # round 0 warms both sides up and is not counted
                for turn in turns:
                    for side, (server, _, _) in servers.items():
                        cpu, started = cpu_seconds(server.pid), time.perf_counter()
                        for proc in clients:
                            assert proc.stdin is not None
                            proc.stdin.write(f"{side} {turn}\n")
                            proc.stdin.flush()
                        counts = [json.loads(proc.stdout.readline()) for proc in clients if proc.stdout is not None]
                        if args.per_kind:
                            time.sleep(0.3)  # the watcher's reloads after this turn's writes belong to it
                        if round_ == 0:
                            continue
                        figures = totals[side, turn]
                        figures["cpu"] += cpu_seconds(server.pid) - cpu
                        figures["wall"] += time.perf_counter() - started
                        figures["calls"] += sum(c["calls"] for c in counts)
                        figures["errors"] += sum(c["errors"] for c in counts)
                        for count in counts:
                            for name, (calls, seconds) in count["waited"].items():
                                waited = latency[side].setdefault(name, [0, 0.0])
                                waited[0] += calls
                                waited[1] += seconds
            for proc in clients:
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait()
        finally:
            for server, _, _ in servers.values():
                server.kill()
                server.wait()
    print(f"base {args.base} against this work tree; {clients_count} lean clients, {args.rounds} rounds")
    for turn in turns:
        per_call = {}
        for side in servers:
            figures = totals[side, turn]
            calls = max(1, int(figures["calls"]))
            per_call[side] = 1000 * figures["cpu"] / calls
            print(
                f"{turn.split()[-1] if args.per_kind else 'mix'} {side}: {calls} calls, {figures['errors']} unexpected "
                f"errors, server CPU {per_call[side]:.3f} ms a call ({calls / figures['wall']:.0f} calls/s)"
            )
        ratio = f"{per_call['work'] / per_call['base']:.3f}" if per_call["base"] else "n/a (no base CPU measured)"
        print(f"  work / base per call: {ratio}")
    for name in sorted(latency["work"]):
        shown = [f"{1000 * s / max(1, n):.1f}" for n, s in (latency[side].get(name, [0, 0.0]) for side in servers)]
        print(f"  {name}: mean latency base {shown[0]} ms, work {shown[1]} ms")


if __name__ == "__main__":
    main()
