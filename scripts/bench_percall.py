"""Server CPU per call under the hardening load test's mix of calls, for two versions of unit_mcp side by side.

    .venv/bin/python scripts/bench_percall.py --base 0deba14            # that commit against this work tree
    .venv/bin/python scripts/bench_percall.py --base HEAD --rounds 6 --seconds 3 --clients 8
    .venv/bin/python scripts/bench_percall.py --base 0deba14 --rounds 3 --per-kind 150   # each kind of call alone

Each side is a real `python -m unit_mcp.server` child (watching its units, as the load test runs it): the base
side imports `unit_mcp` exported from the `--base` commit, the other side this work tree's. Lean client processes
(plain keep-alive POSTs, so the clients' CPU is small) send the load test's mix (tests/support/load_mix.py): 35 % a read
then a hash-checked patch of a tally unit, the rest reads, lists, inspects, snapshots, log reads, resolves,
reloads and dry runs. The sides take turns, round by round, so drift on this shared machine hits both alike.
The figure is the server's user+system CPU (from /proc) over the calls it answered, with the calls per second and each
tool's mean latency. Prints figures only; bench/RESULTS.md has the figures that were kept.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
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
    printed: dict[str, str] = {}
    assert server.stdout is not None
    while "MCP_TOKEN" not in printed or "MCP_URL" not in printed:
        line = server.stdout.readline()
        if not line:
            raise RuntimeError(f"the {side} server exited before it listened")
        key, _, value = line.rstrip("\n").partition("=")
        printed[key] = value
    return server, printed["MCP_URL"], printed["MCP_TOKEN"]


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
    parser.add_argument("--client", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client is not None:
        client(args.client, json.loads(os.environ.pop("PERCALL_TARGETS")))
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
