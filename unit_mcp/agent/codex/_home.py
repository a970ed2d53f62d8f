"""CodexHome: a fresh private world for one `codex exec` run, and the environment that confines it there.

Codex reads `$CODEX_HOME/config.toml` (and writes its state databases next to it), looks in HOME for
other config, and merges project instructions found from its working directory. A run given `env()` sees
only its own: HOME, CODEX_HOME and TMPDIR under the root, an empty working directory, the config and model
catalogue written by `write`, and no variable inherited from the caller except PATH and the locale, so
neither the user's `~/.codex` nor an `OPENAI_API_KEY` in the caller's environment is ever used.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ...paths import write_file
from ._config import CodexModel, McpServer, codex_config, config_env, dumps_catalog, dumps_toml

_KEPT = ("PATH", "LANG", "LC_ALL", "TZ")


class CodexHome:
    def __init__(
        self, root: str | os.PathLike[str] | None = None, *, parent: str | os.PathLike[str] | None = None
    ) -> None:
        """`root` defaults to a new folder in `parent` (else the system temp dir), removed by `cleanup()`."""
        self._owned = root is None
        if root is None:
            if parent is not None:
                Path(parent).mkdir(parents=True, exist_ok=True)
            root = tempfile.mkdtemp(prefix="unit-mcp-codex-", dir=parent)
        self.root = Path(root)
        for folder in (self.home, self.codex_home, self.workdir, self.tmp):
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def codex_home(self) -> Path:
        return self.root / "codex"

    @property
    def workdir(self) -> Path:
        """The empty working directory: no project instructions or config above it are ever merged."""
        return self.root / "work"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def config_path(self) -> Path:
        return self.codex_home / "config.toml"

    @property
    def catalog_path(self) -> Path:
        return self.codex_home / "model-catalog.json"

    def write(self, model: CodexModel, server: McpServer, *, instructions: str | None = None) -> Path:
        """Write the model catalogue and `config.toml` (owner-only); returns the config's path."""
        write_file(self.codex_home, self.catalog_path.name, dumps_catalog(model).encode(), durable=False)
        config = codex_config(model, server, catalog_path=str(self.catalog_path), instructions=instructions)
        write_file(self.codex_home, self.config_path.name, dumps_toml(config).encode(), durable=False)
        return self.config_path

    def env(self, model: CodexModel, server: McpServer, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {key: os.environ[key] for key in _KEPT if key in os.environ}
        env.update(HOME=str(self.home), CODEX_HOME=str(self.codex_home), TMPDIR=str(self.tmp), NO_COLOR="1")
        env.update(config_env(model, server))
        env.update(extra or {})
        return env

    def cleanup(self) -> None:
        if self._owned:
            shutil.rmtree(self.root, ignore_errors=True)
