"""A durable worker whose one agent (`agent`) runs its turns on OpenCode, Codex or a step loop:
`python provider_worker.py DATA SYSTEM_DB opencode NODE_URL MODEL --executor-id ID --takeover` drives a node the test
owns, so the node outlives the worker (its password in OPENCODE_SERVER_PASSWORD, never on the command line);
`... codex BINARY MODEL_URL ...` runs the Codex CLI on the model at MODEL_URL (a Responses API);
`... openai MCP_URL MODEL_URL ...` runs the step-loop OpenAIAgent on MODEL_URL with the unit tools at MCP_URL (its token
in MCP_TOKEN), and says "model client made" on stderr each time it makes a model client."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import openai

from unit_mcp import tracing
from unit_mcp.agent import (
    AgentApprovals,
    AgentRegistry,
    AgentToolSurface,
    DurableWorker,
    McpToolSource,
    OpenAIAgent,
    SessionStore,
)
from unit_mcp.agent.codex import CodexAgent, CodexModel
from unit_mcp.agent.opencode import OpenCodeAgent, OpenCodeClient

AGENT = "agent"
TURN_TIMEOUT = 120.0


@asynccontextmanager
async def provider_agent(args: argparse.Namespace, surface: AgentToolSurface) -> AsyncIterator[Any]:
    if args.provider == "codex":
        model = CodexModel(name="m", base_url=args.model)
        yield CodexAgent(model=model, binary=args.target, id=AGENT, turn_timeout=TURN_TIMEOUT)
        return
    if args.provider == "openai":
        async with McpToolSource(args.target, token=os.environ["MCP_TOKEN"]) as source:
            surface.add_source(source)
            yield OpenAIAgent(id=AGENT, model="scripted", base_url=args.model, stream=False)
        return
    async with OpenCodeClient(args.target, password=os.environ["OPENCODE_SERVER_PASSWORD"]) as client:
        yield OpenCodeAgent(client, model=args.model, id=AGENT, turn_timeout=TURN_TIMEOUT)


async def main(args: argparse.Namespace) -> None:
    store = SessionStore(args.data)
    surface = AgentToolSurface(AgentApprovals())
    try:
        async with provider_agent(args, surface) as agent:
            registry = AgentRegistry()
            registry.register(AGENT, lambda deps: agent)
            worker = DurableWorker(
                store=store,
                registry=registry,
                tools=surface,
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


def count_model_clients() -> None:
    made = openai.AsyncOpenAI.__init__

    def making(client: openai.AsyncOpenAI, *args: Any, **kwargs: Any) -> None:
        print("model client made", file=sys.stderr, flush=True)
        made(client, *args, **kwargs)

    openai.AsyncOpenAI.__init__ = making  # type: ignore[method-assign]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("data", type=Path)
    parser.add_argument("system_db")
    parser.add_argument("provider", choices=["opencode", "codex", "openai"])
    parser.add_argument("target", help="the node's URL (opencode), the binary (codex), the unit server's URL (openai)")
    parser.add_argument("model", help="the model as the node names it (opencode), else the model's URL")
    parser.add_argument("--executor-id", required=True)
    parser.add_argument("--takeover", action="store_true")
    count_model_clients()
    tracing.configure("unit-mcp-agent", "provider_worker")  # on when the test sets OTEL_* (tests/otel)
    anyio.run(main, parser.parse_args())
