"""The `live` section of scripts/bench.py: one web app under a constant-rate load while its code changes (issue 35).

Three contestants serve the same routes (`/shop/`: GET the count, POST `add` to increment it, `events` an SSE
stream), each in its own process, one after the other:

- `unit-mcp`: `unit_mcp.server --app-port 0`; an agent client (the `mcp` SDK's real client) makes the changes as
  `unit_apply_patch` calls (each one patch + reload); the count lives in the unit (snapshot/restore);
- `uvicorn --reload`: the changes are file edits, the server restarts on each; the count lives in SQLite (WAL);
- `uvicorn --workers 2` + SIGHUP: each edit is followed by a rolling restart (a new worker in service before the
  old one is retired); the count lives in SQLite, shared by the two workers.

The load: arrival times fixed in advance (`RATE` requests/s spread over `CONNECTIONS` keep-alive connections,
half POSTs), each latency measured from the intended send time, so a stall is counted, not hidden; plus
`SSE_CLIENTS` streams. A baseline without changes and `EDITS` changes at a fixed interval, one of them a syntax error
and one an import that hangs past the reload timeout, in `ROUNDS` alternating blocks (quiet, changing) so that the
baseline and the changes see the same machine. A failed request is a connection error, a timeout or a non-2xx
answer; it is not retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RATE = 200
CONNECTIONS = 8
SSE_CLIENTS = 2
RELOAD_TIMEOUT_S = 2.0
HANG_S = 4.0
"""The hanging import sleeps this long: past unit-mcp's --reload-timeout (and past one edit interval)."""

UNIT = """\
import asyncio

from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

VERSION = 0
count = 0


async def add(request):
    global count
    count += 1
    return JSONResponse({"count": count, "version": VERSION})


async def show(request):
    return JSONResponse({"count": count, "version": VERSION})


async def events(request):
    async def ticks():
        for n in range(100_000):
            yield f"data: {VERSION} {n}\\n\\n"
            await asyncio.sleep(0.1)

    return StreamingResponse(ticks(), media_type="text/event-stream")


def snapshot():
    return {"count": count}


def restore(state):
    global count
    count = state["count"]


routes = [Route("/", show), Route("/add", add, methods=["POST"]), Route("/events", events)]
"""

PEER_APP = """\
import asyncio
import os
import sqlite3

from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Mount, Route

VERSION = 0
_conn = None


def db():
    global _conn
    if _conn is None:
        _conn = sqlite3.connect(os.environ["SHOP_DB"], timeout=10, isolation_level=None)
        _conn.execute("pragma journal_mode=wal")
        _conn.execute("pragma synchronous=normal")
    return _conn


async def add(request):
    (n,) = db().execute("update counter set n = n + 1 returning n").fetchone()
    return JSONResponse({"count": n, "version": VERSION})


async def show(request):
    (n,) = db().execute("select n from counter").fetchone()
    return JSONResponse({"count": n, "version": VERSION})


async def events(request):
    async def ticks():
        for n in range(100_000):
            yield f"data: {VERSION} {n}\\n\\n"
            await asyncio.sleep(0.1)

    return StreamingResponse(ticks(), media_type="text/event-stream")


app = Starlette(routes=[Mount("/shop", routes=[Route("/", show), Route("/add", add, methods=["POST"]),
                                               Route("/events", events)])])
"""

SYNTAX_ERROR_AT = 0.3
HANG_AT = 0.6
"""Which of the changes (as a fraction of them) is the syntax error, and which the hanging import."""


def version_line(version: int) -> str:
    return f"VERSION = {version}\n"


def hanging(version: int) -> str:
    return f"VERSION = {version}\nimport time as _time\n_time.sleep({HANG_S})\n"


@dataclass
class Load:
    """What the load saw: per request (intended send time, latency ms, ok)."""

    requests: list[tuple[float, float, bool]] = field(default_factory=list)
    posts_acked: int = 0
    backwards: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    sse_events: int = 0
    sse_breaks: int = 0

    def fail(self, why: str, count: int = 1) -> None:
        self.failures[why] = self.failures.get(why, 0) + count

    def add(self, other: Load, shift: float) -> None:
        """Count in what another block's load saw, its send times moved `shift` seconds on."""
        self.requests += [(at + shift, latency, ok) for at, latency, ok in other.requests]
        self.posts_acked += other.posts_acked
        self.backwards += other.backwards
        self.sse_events += other.sse_events
        self.sse_breaks += other.sse_breaks
        for why, count in other.failures.items():
            self.fail(why, count)


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionResetError("closed")
    status = int(status_line.split()[1])
    length, close = 0, False
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.lower() == "content-length":
            length = int(value)
        elif name.lower() == "connection" and value.strip().lower() == "close":
            close = True
    return status, await reader.readexactly(length), close


async def connection(port: int, slot: int, start: float, count: int, load: Load) -> None:
    """One keep-alive connection: request k at start + (k * CONNECTIONS + slot) / RATE, sequentially."""
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    last_version = -1
    for k in range(count):
        intended = start + (k * CONNECTIONS + slot) / RATE
        await asyncio.sleep(max(0.0, intended - time.perf_counter()))
        post = (k + slot) % 2 == 0
        line = "POST /shop/add HTTP/1.1" if post else "GET /shop/ HTTP/1.1"
        request = f"{line}\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n\r\n"
        ok = False
        try:
            if writer is None:
                reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
            assert reader is not None and writer is not None
            writer.write(request.encode())
            status, body, close = await asyncio.wait_for(_response(reader), 10)
            if close:
                writer.close()
                writer = None
            if 200 <= status < 300:
                ok = True
                version = json.loads(body)["version"]
                load.backwards += version < last_version
                last_version = max(last_version, version)
                load.posts_acked += post
            else:
                load.fail(f"http {status}")
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
            load.fail(type(exc).__name__)
            if writer is not None:
                writer.close()
            writer = None
        load.requests.append((intended - start, (time.perf_counter() - intended) * 1000, ok))
    if writer is not None:
        writer.close()


async def sse_client(port: int, until: float, load: Load) -> None:
    while time.perf_counter() < until:
        writer = None
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
            writer.write(f"GET /shop/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            while time.perf_counter() < until:
                line = await asyncio.wait_for(reader.readline(), max(0.1, min(5.0, until - time.perf_counter())))
                if not line:
                    raise ConnectionResetError("stream ended")
                load.sse_events += line.startswith(b"data:")
        except TimeoutError:
            if time.perf_counter() < until:
                load.sse_breaks += 1
        except (OSError, asyncio.IncompleteReadError, ValueError):
            load.sse_breaks += 1
            await asyncio.sleep(0.05)
        finally:
            if writer is not None:
                writer.close()


async def get_count(port: int) -> int | None:
    for _ in range(100):
        with contextlib.suppress(OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError, KeyError):
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
            writer.write(f"GET /shop/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
            status, body, _ = await asyncio.wait_for(_response(reader), 10)
            writer.close()
            if status == 200:
                return int(json.loads(body)["count"])
        await asyncio.sleep(0.2)
    return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def wait_serving(port: int, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await get_count(port) is not None:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"nothing serves /shop/ on port {port}")


Change = Callable[[int, str], Awaitable[dict[str, Any]]]
"""Make change number k of kind "version", "syntax" or "hang"; returns what it reported."""


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))] if ordered else float("nan")


ROUNDS = 5
"""The baseline and the changes come in this many alternating blocks (quiet, then changing), so both see the same
machine: measured one after the other, a neighbour's minute of work on this shared machine once moved the changing
phase's p50 by 37% and its p99 ratio to 2.2, with nothing of ours behind it."""


async def drive(port: int, change: Change, baseline_s: float, seconds: float, edits: int) -> dict[str, Any]:
    """The load in `ROUNDS` blocks of a quiet part (no changes) and a changing part (its share of the `edits`
    changes at a fixed interval); the figures of the quiet parts make the baseline, those of the others the
    changing phase. Each part has a load process of its own, started once the previous part's requests are all
    answered or failed."""
    loads = {"baseline": Load(), "changing": Load()}
    asked: dict[str, list[float]] = {"baseline": [], "changing": []}
    reports: list[dict[str, Any]] = []
    kinds = {round(edits * SYNTAX_ERROR_AT): "syntax", round(edits * HANG_AT): "hang"}
    parts = (("baseline", baseline_s, 0), ("changing", seconds, edits // ROUNDS))
    blocks = [(phase, length / ROUNDS, changes) for _ in range(ROUNDS) for phase, length, changes in parts]
    made = 0
    for n, (phase, phase_s, changes) in enumerate(blocks):
        start_wall = time.time() + 2.0  # the load process is started and connected by then
        start = time.perf_counter() + (start_wall - time.time())
        block_asked: list[float] = []
        first = made + 1
        made += changes

        async def changer(
            start: float = start, changes: int = changes, first: int = first, phase_s: float = phase_s,
            block_asked: list[float] = block_asked,
        ) -> None:  # fmt: skip
            interval = phase_s / max(changes, 1)
            for m, k in enumerate(range(first, first + changes), 1):
                await asyncio.sleep(max(0.0, start + m * interval - interval / 2 - time.perf_counter()))
                kind = kinds.get(k, "version")
                block_asked.append(time.perf_counter() - start)
                began = time.perf_counter()
                report = await change(k, kind)
                reports.append({"k": k, "kind": kind, "s": round(time.perf_counter() - began, 3), **report})

        loader = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--load", str(port), repr(start_wall), repr(phase_s), stdout=subprocess.PIPE
        )
        _, (out, _) = await asyncio.gather(changer(), loader.communicate())
        shift = n * (baseline_s + seconds + 10.0)  # blocks laid end to end, further apart than the 5 s windows below
        loads[phase].add(Load(**json.loads(out)), shift)
        asked[phase] += [at + shift for at in block_asked]
    figures: dict[str, Any] = {}
    for phase, load in loads.items():
        latencies = [latency for _, latency, ok in load.requests if ok]
        figures[phase] = {
            "requests": len(load.requests),
            "failed": sum(not ok for *_, ok in load.requests),
            "failures": load.failures,
            "p50_ms": round(statistics.median(latencies), 2) if latencies else None,
            "p99_ms": round(p99(latencies), 2),
            "max_ms": round(max(latencies), 1) if latencies else None,
            "versions_backwards": load.backwards,
            "posts_acked": load.posts_acked,
            "sse_events": load.sse_events,
            "sse_breaks": load.sse_breaks,
        }
        if phase == "changing":
            after = [lat for at, lat, ok in load.requests if ok and any(0 <= at - a < 1.0 for a in asked[phase])]
            figures[phase]["p99_in_second_after_change_ms"] = round(p99(after), 2)
            figures[phase]["changes"] = reports
            figures[phase]["failed_within_5s_of_bad_changes"] = sum(
                not ok
                for at, _, ok in load.requests
                for report, a in zip(reports, asked[phase], strict=True)
                if report["kind"] != "version" and 0 <= at - a < 5.0
            )
        figures[phase]["_posts"] = load.posts_acked
    return figures


async def run_load(port: int, start_wall: float, seconds: float) -> Load:
    """The load of one phase, in a process of its own (`--load`): the agent's MCP client in the bench process
    must not stall the load's clock. Starts at `start_wall` (wall clock, shared with the changes' schedule)."""
    load = Load()
    start = time.perf_counter() + (start_wall - time.time())
    per_connection = int(seconds * RATE / CONNECTIONS)
    tasks = [connection(port, slot, start, per_connection, load) for slot in range(CONNECTIONS)]
    tasks += [sse_client(port, start + seconds, load) for _ in range(SSE_CLIENTS)]
    await asyncio.gather(*tasks)
    return load


def finish(figures: dict[str, Any], final_count: int | None) -> dict[str, Any]:
    acked = figures["baseline"].pop("_posts") + figures["changing"].pop("_posts")
    figures["posts_acked"] = acked
    figures["final_count"] = final_count
    figures["lost_writes"] = None if final_count is None else max(0, acked - final_count)
    figures["applied_unacknowledged"] = None if final_count is None else max(0, final_count - acked)
    return figures


async def ours(work: Path, baseline_s: float, seconds: float, edits: int, http_client: Any) -> dict[str, Any]:
    units = work / "units"
    units.mkdir(parents=True)
    (units / "shop.py").write_text(UNIT)
    server = subprocess.Popen(
        [sys.executable, "-m", "unit_mcp.server", "--units", str(units), "--data-dir", str(work / "data"),
         "--no-watch", "--app-port", "0", "--reload-timeout", str(RELOAD_TIMEOUT_S)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        printed: dict[str, str] = {}
        assert server.stdout is not None
        while "APP_URL" not in printed:
            line = await asyncio.to_thread(server.stdout.readline)
            if not line:
                raise RuntimeError("unit_mcp.server exited before it printed APP_URL")
            key, _, value = line.rstrip("\n").partition("=")
            printed[key] = value
        port = int(printed["APP_URL"].rstrip("/").rsplit(":", 1)[1])
        await wait_serving(port)
        async with http_client(printed["MCP_URL"], printed["MCP_TOKEN"]) as client:
            current = {"version": 0}

            async def change(k: int, kind: str) -> dict[str, Any]:
                old = version_line(current["version"])
                new = {"version": version_line(k), "syntax": "VERSION = (\n", "hang": hanging(k)}[kind]
                result = await client.call_tool(
                    "unit_apply_patch", {"unit_id": "shop", "source_id": "shop.py", "old": old, "new": new}
                )
                content = result.structured_content or {}
                reload = content.get("reload") or {}
                if not result.is_error and reload.get("reloaded"):
                    current["version"] = k
                return {
                    "error": bool(result.is_error),
                    "code": (content.get("error") or {}).get("code") if result.is_error else None,
                    # A reload's evidence leaves a zero out (a result's defaults are not sent): 0.0 then.
                    "blocked_ms": reload.get("blocked_ms", 0.0) if reload else None,
                    "window_ms": reload.get("window_ms", 0.0) if reload else None,
                }

            figures = await drive(port, change, baseline_s, seconds, edits)
        figures = finish(figures, await get_count(port))
        reports = figures["changing"]["changes"]
        blocked = [r["blocked_ms"] for r in reports if r.get("blocked_ms") is not None]
        windows = [r["window_ms"] for r in reports if r.get("window_ms") is not None]
        figures["reloads"] = len(blocked)
        figures["blocked_ms"] = {"p50": round(statistics.median(blocked), 3), "p99": round(p99(blocked), 3),
                                 "max": round(max(blocked), 3)}  # fmt: skip
        figures["window_ms"] = {"p50": round(statistics.median(windows), 3), "p99": round(p99(windows), 3)}
        figures["bad_changes"] = [r for r in reports if r["kind"] != "version"]
        return figures
    finally:
        server.terminate()
        await asyncio.to_thread(server.wait, 30)


async def peer(work: Path, baseline_s: float, seconds: float, edits: int, *, rolling: bool) -> dict[str, Any]:
    folder = work / "app"
    folder.mkdir(parents=True)
    app_file = folder / "shop_app.py"
    app_file.write_text(PEER_APP)
    database = work / "shop.db"
    import sqlite3

    with contextlib.closing(sqlite3.connect(database)) as db:
        db.execute("pragma journal_mode=wal")
        db.execute("create table counter (n integer)")
        db.execute("insert into counter values (0)")
        db.commit()
    port = free_port()
    how = ["--workers", "2"] if rolling else ["--reload", "--reload-dir", str(folder)]
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "shop_app:app", "--app-dir", str(folder), "--port", str(port),
         "--log-level", "warning", *how],
        env={**os.environ, "SHOP_DB": str(database)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await wait_serving(port)
        current = {"text": PEER_APP}

        async def change(k: int, kind: str) -> dict[str, Any]:
            valid = PEER_APP.replace(version_line(0), version_line(k))
            text = {"version": valid, "syntax": PEER_APP.replace(version_line(0), "VERSION = (\n"),
                    "hang": PEER_APP.replace(version_line(0), hanging(k))}[kind]  # fmt: skip
            app_file.write_text(text)
            current["text"] = text
            if rolling:
                server.send_signal(signal.SIGHUP)
            return {}

        figures = await drive(port, change, baseline_s, seconds, edits)
        if current["text"] != PEER_APP:  # the last change was valid: nothing to put back
            pass
        return finish(figures, await get_count(port))
    finally:
        server.terminate()
        try:
            await asyncio.to_thread(server.wait, 30)
        except subprocess.TimeoutExpired:
            server.kill()


async def bounded(seconds: float, work: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """A contestant's run within its own time bound; a hang is reported as a miss, not waited out."""
    try:
        return await asyncio.wait_for(work, seconds)
    except TimeoutError:
        return {"hang": f"did not finish within {seconds:g} s"}


if __name__ == "__main__":
    if sys.argv[1:2] != ["--load"] or len(sys.argv) != 5:
        sys.exit("usage: bench_live.py --load PORT START_WALL SECONDS (run by scripts/bench.py --only live)")
    ran = asyncio.run(run_load(int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])))
    print(json.dumps(vars(ran)))
