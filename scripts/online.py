"""`scripts/test-online`: check the online configuration, then run the online scenario on it with pytest.

Settings (a TOML config file's keys, or the environment's UNIT_MCP_ONLINE_<KEY>, which wins):
  provider      openai, codex or opencode: the agent that runs the scenario
  model         the model name at the provider's endpoint
  base_url      the provider's OpenAI-compatible endpoint
  api_key_env   the variable holding the API key (default OPENAI_API_KEY), or
  api_key_file  a file of yours (mode 0600) holding it
  binary        the opencode or codex binary (default $OPENCODE_PATH / $CODEX_PATH, else PATH)
Every missing or unusable piece is named at once, with where to give it; nothing runs then (exit 2).
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCENARIO = "tests/agent/online_scenario.py"
KEYS = ("provider", "model", "base_url", "api_key_env", "api_key_file", "binary")
PROVIDERS = ("openai", "codex", "opencode")
KEY_VARIABLE = "UNIT_MCP_ONLINE_API_KEY"  # how the key reaches the scenario: the environment, never argv


class Missing(Exception):
    """What is missing or unusable, one entry per piece."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(f"  - {problem}" for problem in problems))
        self.problems = problems


def where(key: str) -> str:
    return f"UNIT_MCP_ONLINE_{key.upper()} or `{key}` in the config file"


def read_config(path: Path | None) -> dict[str, str]:
    if path is None:
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise Missing([f"the config file {path} cannot be read: {exc}"]) from None
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise Missing([f"the config file {path} has unknown key(s) {', '.join(unknown)}; known: {', '.join(KEYS)}"])
    return {key: str(value) for key, value in data.items()}


def resolve(config: Mapping[str, str], env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The scenario's settings and the environment it runs in (the key in `KEY_VARIABLE`), or `Missing`."""
    given = {key: env.get(f"UNIT_MCP_ONLINE_{key.upper()}") or config.get(key) or "" for key in KEYS}
    problems: list[str] = []
    provider = given["provider"]
    if not provider:
        problems.append(f"provider: which agent runs the scenario, one of {', '.join(PROVIDERS)} ({where('provider')})")
    elif provider not in PROVIDERS:
        problems.append(f"provider: {provider!r} is not one of {', '.join(PROVIDERS)} ({where('provider')})")
    for key, what in (("model", "the model name"), ("base_url", "the provider's OpenAI-compatible endpoint")):
        if not given[key]:
            problems.append(f"{key}: {what} ({where(key)})")
    key = ""
    if given["api_key_file"]:
        path = Path(given["api_key_file"]).expanduser()
        try:
            status = path.stat()
            if status.st_uid != os.getuid() or stat.S_IMODE(status.st_mode) & 0o077:
                problems.append(f"api_key_file: {path} must be yours with mode 0600 (chmod 600 {path})")
            else:
                key = path.read_text().strip()
                if not key:
                    problems.append(f"api_key_file: {path} is empty")
        except OSError as exc:
            problems.append(f"api_key_file: {path} cannot be read: {exc.strerror or exc}")
    else:
        variable = given["api_key_env"] or "OPENAI_API_KEY"
        key = env.get(variable, "")
        if not key:
            problems.append(
                f"credentials: the API key variable {variable} is not set (set it, or name another with "
                f"{where('api_key_env')}, or give {where('api_key_file')})"
            )
    if provider in ("opencode", "codex"):
        from unit_mcp.agent.codex import find_codex
        from unit_mcp.agent.opencode import find_opencode

        find = find_opencode if provider == "opencode" else find_codex
        try:
            given["binary"] = str(find(given["binary"] or None))
        except Exception as exc:  # OpenCodeNotInstalled / CodexNotInstalled: where it looked, how to install
            problems.append(f"binary: {exc} ({where('binary')})")
    if problems:
        raise Missing(problems)
    settings = {"provider": provider, "model": given["model"], "base_url": given["base_url"]}
    settings["api_key_env"] = KEY_VARIABLE
    run_env = {**env, KEY_VARIABLE: key, "UNIT_MCP_ONLINE_SETTINGS": json.dumps(settings)}
    if provider == "opencode":
        run_env["OPENCODE_PATH"] = given["binary"]
    elif provider == "codex":
        run_env["CODEX_PATH"] = given["binary"]
    return settings, run_env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/test-online", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config", type=Path, help="a TOML file of the settings below (default: $UNIT_MCP_ONLINE_CONFIG)"
    )
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    args = parser.parse_args(argv)
    config = args.config or (
        Path(os.environ["UNIT_MCP_ONLINE_CONFIG"]) if os.environ.get("UNIT_MCP_ONLINE_CONFIG") else None
    )
    try:
        settings, env = resolve(read_config(config), os.environ)
    except Missing as exc:
        print(
            f"scripts/test-online: cannot run the online scenario against a real provider; missing:\n{exc}",
            file=sys.stderr,
        )
        print('See docs/agent.md, "Online tests".', file=sys.stderr)
        return 2
    shown = ", ".join(f"{key}={value}" for key, value in settings.items() if key != "api_key_env")
    print(f"scripts/test-online: the online scenario with {shown}", file=sys.stderr, flush=True)
    command = [sys.executable, "-m", "pytest", SCENARIO, "-p", "no:randomly", *args.pytest_args]
    return subprocess.run(command, cwd=REPO, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
