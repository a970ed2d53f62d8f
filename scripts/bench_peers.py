#!/usr/bin/env python3
"""Benchmark: this agent runner against its peers on the same plans (0, 1 and 21 tool calls per turn).

Contestants: a bare `AsyncOpenAI` + `mcp.Client` loop (the floor), this runner (`OpenAIAgent`, durability
"always" and "flush"), pydantic-ai and openai-agents (tracing off). All talk to one scripted model server
(`unit_mcp.testing`) and to the project's MCP server (`python -m unit_mcp.server`) through the bridge with its
token, handed to each client on its standard input. Each contestant is a long-lived process of its own, so its
CPU time is its own; turns run one at a time, interleaved (each round rotates the order). The peers live in a
bench venv under `.cache/bench-peers` (created on first use from PEERS), never in the project's.

    .venv/bin/python scripts/bench_peers.py [--quick] [--only ours] [--rounds N] [--write]

`--write` replaces the section "Against the peers" of bench/RESULTS.md with this run's table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

STARTED = time.perf_counter()  # a worker's first turn is timed from here
REPO = Path(__file__).resolve().parents[1]
PEERS_VENV = REPO / ".cache" / "bench-peers"
PEERS = ("pydantic-ai-slim[openai,mcp]==2.68.*", "openai-agents==0.24.*")
OURS = ("bare", "ours", "ours-flush")
ALL = (*OURS, "pydantic-ai", "openai-agents")
PLANS = (0, 1, 21)
TOOL = "unit_list"
MODEL = "scripted"
SECTION = "## Against the peers"
WAIT = 120.0  # seconds a worker may take to answer one command before the run is called broken

Turn = Callable[[str], Awaitable[int]]  # run one turn for this user text; the number of tool results it got
Prepare = Callable[[], Awaitable[None]]  # what a client does before a turn, outside the timed part
Client = tuple[Turn, Prepare]


async def ready() -> None:
    """Nothing to prepare: the peers and the bare loop start each turn from a list of messages."""


# -- workers: one process per contestant ------------------------------------------------------------------


@contextlib.asynccontextmanager
async def bare(cfg: dict[str, Any]) -> AsyncIterator[Client]:
    """The floor: one chat request per step, every call straight to the MCP client."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from openai import AsyncOpenAI

    auth = {"Authorization": f"Bearer {cfg['token']}"}
    async with (
        httpx2.AsyncClient(headers=auth) as http,
        Client(streamable_http_client(cfg["mcp_url"], http_client=http)) as mcp,
        AsyncOpenAI(base_url=cfg["model_url"], api_key="unused") as openai,
    ):
        listed = await mcp.list_tools()
        tools: Any = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description or "", "parameters": t.input_schema},
            }
            for t in listed.tools
        ]

        async def turn(text: str) -> int:
            messages: list[Any] = [{"role": "user", "content": text}]
            results = 0
            while True:
                completion = await openai.chat.completions.create(model=MODEL, messages=messages, tools=tools)
                message = completion.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    return results
                for call in message.tool_calls:
                    assert call.type == "function"
                    result = await mcp.call_tool(call.function.name, json.loads(call.function.arguments or "{}"))
                    output = "".join(getattr(block, "text", "") for block in result.content)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
                    results += not result.is_error

        yield turn, ready


def ours(durability: str) -> Callable[[dict[str, Any]], contextlib.AbstractAsyncContextManager[Client]]:
    @contextlib.asynccontextmanager
    async def runner(cfg: dict[str, Any]) -> AsyncIterator[Client]:
        """This runner as its README shows it; each turn in a fresh session (the peers keep no history either),
        created before the turn is timed, as a conversation's later turns would find it."""
        from unit_mcp.agent import (
            AgentApprovals,
            AgentRegistry,
            AgentRunner,
            AgentToolSurface,
            McpToolSource,
            OpenAIAgent,
            SessionStore,
        )
        from unit_mcp.agent.items import Item, ToolResultItem
        from unit_mcp.agent.sessions import Durability
        from unit_mcp.agent.turns import TurnCallbacks, TurnStatus
        from unit_mcp.wire import RISKS

        surface = AgentToolSurface(AgentApprovals(dict.fromkeys(RISKS, "auto")))  # every tool offered, as the peers do
        registry = AgentRegistry()
        registry.register(
            "bench", lambda deps: OpenAIAgent(id="bench", model=MODEL, base_url=cfg["model_url"], max_steps=64)
        )
        level: Durability = "always" if durability == "always" else "flush"
        async with McpToolSource(cfg["mcp_url"], token=cfg["token"]) as source:
            surface.add_source(source)
            store = SessionStore(Path(cfg["data"]) / "sessions", durability=level)
            async with AgentRunner(store=store, registry=registry, tools=surface) as agents:
                sessions: list[str] = []

                async def prepare() -> None:
                    sessions.append((await agents.create_session("bench")).id)

                async def turn(text: str) -> int:
                    results: list[Item] = []
                    seen = TurnCallbacks(on_item=lambda i: results.append(i) if isinstance(i, ToolResultItem) else None)
                    handle = await (await agents.run_turn(sessions.pop(), text, seen)).wait()
                    if handle.status != TurnStatus.COMPLETED:
                        raise RuntimeError(f"turn {handle.id} ended {handle.status}: {handle.error}")
                    return sum(isinstance(i, ToolResultItem) and not i.is_error for i in results)

                yield turn, prepare
            store.close()

    return runner


@contextlib.asynccontextmanager
async def pydantic_ai(cfg: dict[str, Any]) -> AsyncIterator[Client]:
    from pydantic_ai import Agent
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.messages import ToolReturnPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    toolset = MCPToolset(cfg["mcp_url"], headers={"Authorization": f"Bearer {cfg['token']}"})
    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=cfg["model_url"], api_key="unused"))
    agent = Agent(model, toolsets=[toolset])
    async with agent:

        async def turn(text: str) -> int:
            result = await agent.run(text)
            parts = [p for m in result.all_messages() for p in m.parts if isinstance(p, ToolReturnPart)]
            return sum(p.outcome == "success" if hasattr(p, "outcome") else True for p in parts)

        yield turn, ready


@contextlib.asynccontextmanager
async def openai_agents(cfg: dict[str, Any]) -> AsyncIterator[Client]:
    from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from agents.items import ToolCallOutputItem
    from agents.mcp import MCPServerStreamableHttp
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    params: Any = {"url": cfg["mcp_url"], "headers": {"Authorization": f"Bearer {cfg['token']}"}}
    async with (
        AsyncOpenAI(base_url=cfg["model_url"], api_key="unused") as client,
        MCPServerStreamableHttp(params, cache_tools_list=True) as server,
    ):
        model = OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
        agent = Agent(name="bench", model=model, mcp_servers=[server])

        async def turn(text: str) -> int:
            result = await Runner.run(agent, text, max_turns=64)
            return sum(isinstance(item, ToolCallOutputItem) for item in result.new_items)

        yield turn, ready


FACTORIES: dict[str, Callable[[dict[str, Any]], contextlib.AbstractAsyncContextManager[Client]]] = {
    "bare": bare,
    "ours": ours("always"),
    "ours-flush": ours("flush"),
    "pydantic-ai": pydantic_ai,
    "openai-agents": openai_agents,
}


async def serve(name: str, started: float) -> None:
    """Worker: a config line, start-up and a first turn (timed apart), then one turn per command line."""
    loop = asyncio.get_running_loop()
    cfg = json.loads(await loop.run_in_executor(None, sys.stdin.readline))
    async with FACTORIES[name](cfg) as (turn, prepare):
        await prepare()
        up = time.perf_counter()
        results = await turn(cfg["first"])
        say({"startup_ms": (up - started) * 1000, "first_ms": (time.perf_counter() - up) * 1000, "results": results})
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            text = json.loads(line)["text"]
            await prepare()
            wall, cpu = time.perf_counter(), time.process_time()
            results = await turn(text)
            say(
                {
                    "ms": (time.perf_counter() - wall) * 1000,
                    "cpu_ms": (time.process_time() - cpu) * 1000,
                    "results": results,
                }
            )


def say(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


# -- the orchestrator ---------------------------------------------------------------------------------------


def peers_python() -> Path:
    """The bench venv's Python with the pinned peers, created on first use; a failed install stops the run."""
    python = PEERS_VENV / "bin" / "python"
    marker = PEERS_VENV / "pins.txt"
    if python.exists() and marker.exists() and marker.read_text() == "\n".join(PEERS):
        return python
    print(f"installing {', '.join(PEERS)} into {PEERS_VENV} ...", file=sys.stderr)
    base = getattr(sys, "_base_executable", sys.executable)
    for argv in ([base, "-m", "venv", "--clear", str(PEERS_VENV)], [str(python), "-m", "pip", "install", "-q", *PEERS]):
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"bench_peers: `{' '.join(argv)}` failed; fix it or run with --only ours:\n{done.stderr}")
    marker.write_text("\n".join(PEERS))
    return python


@dataclass
class Worker:
    name: str
    python: Path
    cfg: dict[str, Any]
    startup_ms: float = 0.0
    first_ms: float = 0.0
    spawn_ms: float = 0.0
    proc: subprocess.Popen[str] | None = None

    def start(self) -> Worker:
        """Spawn the process and run its first turn; `spawn_ms` counts from the spawn (interpreter start-up too)."""
        started = time.perf_counter()
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
        self.proc = subprocess.Popen(
            [str(self.python), __file__, "--worker", self.name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.cfg["stderr"], text=True, env=env, cwd=REPO,
        )  # fmt: skip
        self._send({k: v for k, v in self.cfg.items() if k != "stderr"})
        answer = self._read()
        self.spawn_ms = (time.perf_counter() - started) * 1000
        self.startup_ms, self.first_ms = answer["startup_ms"], answer["first_ms"]
        return self

    def turn(self, text: str) -> dict[str, Any]:
        self._send({"text": text})
        return self._read()

    def close(self) -> None:
        if self.proc is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            if self.proc.wait(WAIT) != 0:
                raise SystemExit(f"bench_peers: worker {self.name} exited {self.proc.returncode}; see its stderr above")

    def _send(self, record: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(record) + "\n")
        self.proc.stdin.flush()

    def _read(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(WAIT)
            raise SystemExit(f"bench_peers: worker {self.name} ended (exit {self.proc.returncode}); see its stderr")
        record: dict[str, Any] = json.loads(line)
        return record


@contextlib.contextmanager
def mcp_server(folder: Path, stderr: IO[str]) -> Any:
    """The project's MCP server on the example units; yields (url, token) read from its ready lines."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "unit_mcp.server", "--data-dir", str(folder), "--no-watch", "--confirm", "none"],
        stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        ready: dict[str, str] = {}
        while "MCP_TOKEN" not in ready:
            line = proc.stdout.readline()
            if not line:
                raise SystemExit(f"bench_peers: the MCP server ended before it was ready (exit {proc.wait()})")
            key, _, value = line.strip().partition("=")
            ready[key] = value
        yield ready["MCP_URL"], ready["MCP_TOKEN"]
    finally:
        proc.terminate()
        proc.wait(30)


def plan_steps(text: str, calls: int) -> list[Any]:
    from unit_mcp.testing import Match, call, say

    when = Match(user_contains=text)
    return [call(TOOL, when=when) for _ in range(calls)] + [say(f"done {text}", when=when)]


@dataclass
class Figures:
    ms: dict[int, list[float]] = field(default_factory=lambda: {plan: [] for plan in PLANS})
    cpu_ms: dict[int, list[float]] = field(default_factory=lambda: {plan: [] for plan in PLANS})
    startup_ms: list[float] = field(default_factory=list)
    first_ms: list[float] = field(default_factory=list)
    spawn_ms: list[float] = field(default_factory=list)


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[-1] if len(values) > 1 else values[0]


def run(names: tuple[str, ...], rounds: int, fresh: int, warmups: int) -> dict[str, Figures]:
    from unit_mcp.testing import ScriptedModel

    python = {name: Path(sys.executable) for name in OURS} | (
        {"pydantic-ai": peers_python(), "openai-agents": peers_python()} if set(names) - set(OURS) else {}
    )
    figures = {name: Figures() for name in names}
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp, open(Path(tmp) / "stderr.log", "w+") as stderr:
        try:
            with mcp_server(Path(tmp) / "server", stderr) as (url, token), ScriptedModel([]) as model:
                base = {"mcp_url": url, "token": token, "model_url": model.base_url, "stderr": stderr}

                def worker(name: str, n: int) -> Worker:
                    first = f"first {name} {n}"
                    model.add(*plan_steps(first, 0))
                    data = Path(tmp) / f"{name}-{n}"
                    data.mkdir()
                    return Worker(name, python[name], {**base, "first": first, "data": str(data)}).start()

                for n in range(fresh):  # the first turn of a fresh process, interleaved across contestants
                    for name in names:
                        fresh_worker = worker(name, n)
                        fresh_worker.close()
                        figures[name].startup_ms.append(fresh_worker.startup_ms)
                        figures[name].first_ms.append(fresh_worker.first_ms)
                        figures[name].spawn_ms.append(fresh_worker.spawn_ms)
                workers = {name: worker(name, fresh) for name in names}
                for warm in range(warmups):  # not measured: first requests of each plan, lazy imports
                    for name in names:
                        for plan in PLANS:
                            text = f"warm {name} {plan} {warm}"
                            model.add(*plan_steps(text, plan))
                            workers[name].turn(text)
                for round_ in range(rounds):
                    order = names[round_ % len(names) :] + names[: round_ % len(names)]
                    for plan in PLANS:
                        for name in order:
                            text = f"turn {name} {plan} {round_}"
                            model.add(*plan_steps(text, plan))
                            answer = workers[name].turn(text)
                            if answer["results"] != plan:
                                raise SystemExit(
                                    f"bench_peers: {name} got {answer['results']} tool results for a {plan}-call plan"
                                )
                            figures[name].ms[plan].append(answer["ms"])
                            figures[name].cpu_ms[plan].append(answer["cpu_ms"])
                for each in workers.values():
                    each.close()
                model.assert_done()
        except BaseException:
            stderr.seek(0)
            sys.stderr.write(stderr.read()[-4000:])
            raise
    return figures


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(figures: dict[str, Figures], rounds: int, load: tuple[float, float]) -> str:
    """The section for bench/RESULTS.md: turn times per client and plan, per-step figures, then the goals."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        SECTION,
        "",
        f"Made by `scripts/bench_peers.py` on {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()} at {when}, {rounds} interleaved rounds (load average {load[0]:.1f} before the "
        f"run, {load[1]:.1f} after). Model: `unit_mcp.testing.ScriptedModel`; tools: `python -m unit_mcp.server` "
        f"through the bridge with its token; each call is `{TOOL}`. Peers: {', '.join(PEERS)}. Client CPU is the "
        "client process's own (the model and the MCP server run in other processes).",
        "",
        "| client | calls in the turn | median ms | p95 ms | client CPU ms (median) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, f in figures.items():
        for plan in PLANS:
            lines.append(
                f"| {name} | {plan} | {median(f.ms[plan]):.1f} | {p95(f.ms[plan]):.1f} | {median(f.cpu_ms[plan]):.1f} |"
            )
    last = PLANS[-1]

    def per_step(name: str, what: str = "ms") -> float:
        series = getattr(figures[name], what)
        return (median(series[last]) - median(series[0])) / last

    lines += [
        "",
        f"Per step: (median of the {last}-call turn - median of the no-call turn) / {last}. Fresh process: start-up "
        "(imports, MCP connection; this runner: its session too) from the worker's first line, then its first turn "
        "alone; in brackets, spawn to the first turn's end as the parent saw it (interpreter start-up too).",
        "",
        "| client | per step ms | above bare ms | CPU ms per step | start-up ms | first turn ms (spawn to end) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, f in figures.items():
        lines.append(
            f"| {name} | {per_step(name):.2f} | {per_step(name) - per_step('bare'):+.2f} | "
            f"{per_step(name, 'cpu_ms'):.2f} | {median(f.startup_ms):.0f} | {median(f.first_ms):.0f} "
            f"({median(f.spawn_ms):.0f}) |"
        )
    lines += ["", "| goal | value | met |", "| --- | --- | --- |"]
    first = median(figures["ours"].first_ms)
    lines.append(f"| first turn in a fresh process (ours) <= 300 ms | {first:.0f} ms | {first <= 300} |")
    if "openai-agents" in figures and "pydantic-ai" in figures:
        for name in ("ours", "ours-flush"):
            ratio = median(figures[name].ms[0]) / median(figures["openai-agents"].ms[0])
            lines.append(f"| no-tool turn, {name} / openai-agents <= 2 | {ratio:.2f} | {ratio <= 2} |")
        better = min(per_step("pydantic-ai"), per_step("openai-agents")) - per_step("bare")
        for name in ("ours", "ours-flush"):
            above = per_step(name) - per_step("bare")
            lines.append(
                f"| per-step overhead above bare, {name} <= better peer's + 1 ms | {above:.2f} ms (better peer: "
                f"{better:.2f} ms) | {above <= better + 1} |"
            )
    return "\n".join(lines) + "\n"


def write_section(text: str) -> None:
    """Replace (or append) the section in bench/RESULTS.md, up to the next `## ` heading."""
    path = REPO / "bench" / "RESULTS.md"
    current = path.read_text()
    start = current.find(SECTION)
    if start < 0:
        path.write_text(current.rstrip("\n") + "\n\n" + text)
        return
    end = current.find("\n## ", start + len(SECTION))
    path.write_text(current[:start] + text + ("" if end < 0 else current[end:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round, 1 fresh process each, no warm-up")
    parser.add_argument("--only", choices=["ours"], help="ours: the bare loop and this runner only (no peers venv)")
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds (default 30)")
    parser.add_argument(
        "--fresh", type=int, default=5, help="fresh processes per client for the first turn (default 5)"
    )
    parser.add_argument("--write", action="store_true", help="replace the section in bench/RESULTS.md")
    parser.add_argument("--worker", choices=ALL, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(serve(args.worker, STARTED))
        return
    rounds, fresh, warmups = (1, 1, 0) if args.quick else (args.rounds, args.fresh, 2)
    names = OURS if args.only == "ours" else ALL
    before = os.getloadavg()[0]
    figures = run(names, rounds, fresh, warmups)
    text = report(figures, rounds, (before, os.getloadavg()[0]))
    print(text)
    if args.write:
        write_section(text)


if __name__ == "__main__":
    main()
