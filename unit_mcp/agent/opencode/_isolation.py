"""IsolatedRoot: a folder that is a whole private world for one OpenCode process, and its environment.

A process run with `env()` sees none of the user's config, data or variables: its own HOME, XDG folders and
TMPDIR under the root, the given config root as XDG_CONFIG_HOME, and only PATH and the locale inherited. It runs
in the config folder itself, the one place OpenCode's loader skips the project config search (docs/safety.md).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...opencode_isolation import ISOLATION_FLAGS, seed_plugin_lock, write_json_atomically
from ._errors import OpenCodeError

_KEPT = ("PATH", "LANG", "LC_ALL", "TZ")
_GUARDED_KEYS = ("permission", "mcp", "tools")


class IsolatedRoot:
    def __init__(
        self, root: str | os.PathLike[str] | None = None, *, config_home: str | os.PathLike[str] | None = None
    ) -> None:
        """`root` defaults to a new temporary folder, removed by `cleanup()`; `config_home` (the
        XDG_CONFIG_HOME holding `opencode/opencode.json`) defaults to `<root>/config`."""
        self._owned = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="unit-mcp-opencode-node-"))
        self.config_home = Path(config_home) if config_home is not None else self.root / "config"
        for name in ("home", "data", "cache", "state", "tmp", "managed"):
            (self.root / name).mkdir(parents=True, exist_ok=True, mode=0o700)
        self.workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        seed_plugin_lock(self.workdir)  # no npm install of the plugin SDK at each start (the launcher's rule)
        self.extra_config: Path | None = None

    @property
    def workdir(self) -> Path:
        """The working directory: the config folder, the one place OpenCode searches no project config from."""
        return self.config_home / "opencode"

    def add_config(self, config: Mapping[str, Any], *, name: str = "extra-config.json") -> Path:
        """Write config the isolated `opencode.json` lacks (a provider, a model) to a file OpenCode merges
        through OPENCODE_CONFIG. It may not carry `permission`, `mcp` or `tools`, at the top or in an agent,
        so it can never loosen the deny-all rules of the isolated config."""
        check_extra_config(config)
        path = self.root / name
        write_json_atomically(path, config)
        self.extra_config = path
        return path

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {key: os.environ[key] for key in _KEPT if key in os.environ}
        env.update(
            HOME=str(self.root / "home"),
            XDG_CONFIG_HOME=str(self.config_home),
            XDG_DATA_HOME=str(self.root / "data"),
            XDG_CACHE_HOME=str(self.root / "cache"),
            XDG_STATE_HOME=str(self.root / "state"),
            TMPDIR=str(self.root / "tmp"),
            PWD=str(self.workdir),
            OPENCODE_TEST_HOME=str(self.root / "home"),
            OPENCODE_TEST_MANAGED_CONFIG_DIR=str(self.root / "managed"),
            OPENCODE_DISABLE_MODELS_FETCH="1",
            OPENCODE_DISABLE_AUTOUPDATE="1",
            **ISOLATION_FLAGS,
        )
        if self.extra_config is not None:
            env["OPENCODE_CONFIG"] = str(self.extra_config)
        env.update(extra or {})
        return env

    def cleanup(self) -> None:
        if self._owned:
            shutil.rmtree(self.root, ignore_errors=True)


def check_extra_config(config: Mapping[str, Any]) -> None:
    """Refuse config that could widen what OpenCode may do (permissions, MCP servers, tool switches)."""
    found = [key for key in _GUARDED_KEYS if key in config]
    agents = config.get("agent") or {}
    if isinstance(agents, Mapping):
        for agent_name, agent in agents.items():
            if isinstance(agent, Mapping):
                found += [f"agent.{agent_name}.{key}" for key in _GUARDED_KEYS if key in agent]
    if found:
        raise OpenCodeError(
            f"extra OpenCode config may not set {', '.join(found)}: the isolated config owns permissions and "
            "MCP servers (put them in the endpoint's policy instead)"
        )
