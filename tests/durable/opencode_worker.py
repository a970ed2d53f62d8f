"""A durable worker whose one agent (`oc`) drives turns on an OpenCode node the test owns, so the node outlives the
worker: `python opencode_worker.py DATA SYSTEM_DB NODE_URL MODEL --executor-id ID --takeover` (the node's password in
OPENCODE_SERVER_PASSWORD, never on the command line)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import anyio

from unit_mcp.agent import AgentApprovals, AgentRegistry, AgentToolSurface, SessionStore
from unit_mcp.agent._durable import DurableWorker
from unit_mcp.agent.opencode import OpenCodeAgent, OpenCodeClient

AGENT = "oc"
TURN_TIMEOUT = 120.0


async def main(args: argparse.Namespace) -> None:
    store = SessionStore(args.data)
    try:
        async with OpenCodeClient(args.node_url, password=os.environ["OPENCODE_SERVER_PASSWORD"]) as client:
            registry = AgentRegistry()
            registry.register(
                AGENT, lambda deps: OpenCodeAgent(client, model=args.model, id=AGENT, turn_timeout=TURN_TIMEOUT)
            )
            worker = DurableWorker(
                store=store,
                registry=registry,
                tools=AgentToolSurface(AgentApprovals()),
                data_dir=args.data,
                executor_id=args.executor_id,
                system_database_url=args.system_db,
                takeover=args.takeover,
            )
            async with worker:
                print(f"worker {args.executor_id} runs durable turns", file=sys.stderr, flush=True)
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for _ in signals:
                        break
    finally:
        store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("data", type=Path)
    parser.add_argument("system_db")
    parser.add_argument("node_url")
    parser.add_argument("model")
    parser.add_argument("--executor-id", required=True)
    parser.add_argument("--takeover", action="store_true")
    anyio.run(main, parser.parse_args())
