"""Who is doing what: the turns running in a session store, by agent and by the process or durable worker that runs
each, with its current step and since when, and the durable workers with their last beat.

Read from the store and the workers' table, never from a runner's memory: `unit-mcp agent status` and the agent
page see every runner sharing the store (docs/agent.md, "Who is doing what").
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel

from .items import EventItem, Session, ToolCallItem, ToolResultItem
from .paused import DECIDED, durable_turn, pending_requests, running_turn
from .sessions import SessionStore, Writer

Step = Literal["starting", "model request", "tool call", "waiting for a person"]


class WorkerBeat(BaseModel):
    """A durable worker as its table knows it: where it runs, when it last beat, whether it lives."""

    executor_id: str
    host: str
    pid: int
    beat: float
    alive: bool


class RunningTurn(BaseModel):
    """One running turn: its session and agent, who runs it (`worker`: a durable worker's executor id, else the
    process as `pid N on HOST`; empty when no live process holds the session), and its current step since `since`
    (`tool`: the tool called, or asked about)."""

    session_id: str
    agent_id: str
    turn_id: str | None
    worker: str
    durable: bool
    step: Step
    tool: str | None = None
    since: float
    started_at: float


class AgentStatus(BaseModel):
    """What `unit-mcp agent status` prints: the running turns (by agent, then worker) and the durable workers."""

    at: float
    turns: list[RunningTurn]
    workers: list[WorkerBeat]


def current_step(session: Session) -> tuple[Step, str | None, float, float]:
    """The running turn's step, its tool, since when, and when the turn started: waiting for a person while one of
    its approval requests is unanswered, in a tool call while a call has no result, else in a model request."""
    turn = running_turn(session)
    started = next(
        (
            item
            for item in reversed(session.items)
            if isinstance(item, EventItem)
            and item.kind == "turn-started"
            and (item.data.get("turn_id") or item.turn_id) == turn
        ),
        None,
    )
    if started is None:
        return "starting", None, session.updated_at, session.updated_at
    items = session.items[session.items.index(started) :]
    asked = [request for request in pending_requests(session, turn) if request.turn_id == turn]
    if asked:
        return "waiting for a person", asked[0].tool, asked[0].created_at, started.created_at
    closed = {item.call_id for item in items if isinstance(item, ToolResultItem)}
    calls = [item for item in items if isinstance(item, ToolCallItem) and item.call_id not in closed]
    if calls:  # running since it was called, or since the person's answer let it run
        decided = [item.created_at for item in items if isinstance(item, EventItem) and item.kind == DECIDED]
        return "tool call", calls[0].name, max([calls[0].created_at, *decided]), started.created_at
    return "model request", None, items[-1].created_at, started.created_at


def _worker(writer: Writer | None, beats: list[WorkerBeat]) -> str:
    """Who runs a turn: the durable worker of that process, else the process; empty when no live process does."""
    if writer is None or not writer.alive():
        return ""
    for beat in beats:
        if beat.alive and (beat.host, beat.pid) == (writer.host, writer.pid):
            return beat.executor_id
    return f"pid {writer.pid} on {writer.host}"


def read_status(store: SessionStore, workers: list[WorkerBeat] | None = None) -> AgentStatus:
    """The running turns of `store`, each named by the durable worker (of `workers`, as `worker_beats` reads them)
    or the process that runs it."""
    workers = workers or []
    now = time.time()
    turns = []
    for session, writer in store.running():
        step, tool, since, started = current_step(session)
        turns.append(
            RunningTurn(
                session_id=session.id,
                agent_id=session.agent_id,
                turn_id=running_turn(session),
                worker=_worker(writer, workers),
                durable=durable_turn(session),
                step=step,
                tool=tool,
                since=since,
                started_at=started,
            )
        )
    turns.sort(key=lambda turn: (turn.agent_id, turn.worker, turn.started_at))
    return AgentStatus(at=now, turns=turns, workers=workers)


def seconds(value: float) -> str:
    """A duration as a person reads it: 4.2 s, 3 min 5 s, 2 h 10 min."""
    value = max(value, 0.0)
    if value < 60:
        return f"{value:.1f} s"
    minutes, secs = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    return f"{minutes // 60} h {minutes % 60} min"


def status_lines(status: AgentStatus) -> list[str]:
    """The status as lines: one per running turn, grouped by agent and worker, then one per durable worker."""
    lines: list[str] = []
    if not status.turns:
        lines.append("no turn is running")
    shown: tuple[str, str] | None = None
    for turn in status.turns:
        if (turn.agent_id, turn.worker) != shown:
            shown = (turn.agent_id, turn.worker)
            lines.append(f"agent {turn.agent_id} on {turn.worker or 'no live process (the turn ended with it)'}:")
        what = f"{turn.step} {turn.tool}" if turn.tool else turn.step
        lines.append(
            f"  session {turn.session_id} turn {turn.turn_id or '?'}: {what} for {seconds(status.at - turn.since)} "
            f"(turn running {seconds(status.at - turn.started_at)})"
        )
    for worker in status.workers:
        state = "alive" if worker.alive else "dead"
        lines.append(
            f"worker {worker.executor_id}: pid {worker.pid} on {worker.host}, {state}, "
            f"last beat {seconds(status.at - worker.beat)} ago"
        )
    return lines
