"""`python -m unit_mcp.testing --script steps.json`: serve a scripted model until SIGINT or SIGTERM.

Prints `OPENAI_BASE_URL=http://127.0.0.1:<port>/v1` (flushed) once it accepts requests, so a test or a
shell can point any OpenAI-compatible client (OpenCode, the agent CLI) at it, then `ANTHROPIC_BASE_URL=…`
(Claude Code) and `GOOGLE_GEMINI_BASE_URL=…` (Gemini CLI): the same script answers all of them.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

import anyio

from .script import Script
from .server import ScriptedModel


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m unit_mcp.testing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--script", required=True, help="JSON file: a list of steps or {'steps': [...]}; '-' = stdin")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument("--model", default="scripted", help="model name reported by /v1/models")
    parser.add_argument("--log", help="append every request as a JSON line to this file")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    script = Script.parse(sys.stdin.read()) if args.script == "-" else Script.load(args.script)
    async with ScriptedModel(script, host=args.host, port=args.port, model=args.model, log_path=args.log) as model:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:  # before the ready lines
            print(f"OPENAI_BASE_URL={model.base_url}", flush=True)
            print(f"ANTHROPIC_BASE_URL={model.url}\nGOOGLE_GEMINI_BASE_URL={model.url}", flush=True)
            async for _ in signals:
                break


def main(argv: Sequence[str] | None = None) -> int:
    anyio.run(serve, parse(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
