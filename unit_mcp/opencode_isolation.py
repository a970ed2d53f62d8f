"""The isolated OpenCode config, and the launch that keeps every other OpenCode config source out of it.

`opencode_config()` is the deny-all config and `write_opencode_config()` its one writer. A deny-all file alone is
not isolation: `plan_launch()` keeps out every config source the pinned OpenCode would merge over it and refuses
the ones it cannot neutralise (docs/safety.md). `write_launcher()` writes the one executable a user runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .database import connect_sqlite
from .paths import write_file

OPENCODE_VERSION = "1.18.33"
OPENCODE_SCHEMA = "https://opencode.ai/config.json"
USER_KEYS = ("provider", "model", "small_model")
"""What a user's own OPENCODE_CONFIG file may contribute to an isolated session: the model, nothing else."""

KEPT_VARIABLES = frozenset(
    {
        "OPENCODE_AUTH_CONTENT",  # credentials (checked for remote config like the stored ones)
        "OPENCODE_SERVER_PASSWORD",
        "OPENCODE_SERVER_USERNAME",
        "OPENCODE_DISABLE_AUTOUPDATE",
        "OPENCODE_DISABLE_MODELS_FETCH",
        "OPENCODE_DISABLE_TERMINAL_TITLE",
        "OPENCODE_DISABLE_AUTOCOMPACT",
        "OPENCODE_DISABLE_PRUNE",
        "OPENCODE_DISABLE_LSP_DOWNLOAD",
        "OPENCODE_MODELS_URL",
        "OPENCODE_MODELS_PATH",
    }
)
"""`OPENCODE_*` variables passed through; every other one is unset (and named on stderr)."""

ISOLATION_FLAGS = {
    "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
    # Defence in depth: no external plugins, no Claude Code prompt files or skills.
    "OPENCODE_PURE": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
}
"""Variables every isolated OpenCode process gets (the launcher's and the agent runner's nodes)."""

_LAUNCH_DIR = "opencode-launch"
LOCAL_ACCESS_DIR = "local-access"
"""Under the config home: one link per local-access grant and `grants.json`, the live ones."""
_LOCAL_GRANTS = "grants.json"
_GRANT_ID = re.compile(r"la-[0-9a-f]{12}")
_VERSION_STAMP = "version.json"
# Options that leave the isolated world: a project folder (OpenCode would load its config and plugins) or
# another OpenCode server (which runs with a config of its own).
_REFUSED_OPTIONS = {
    "--dir": "a project folder would bring that folder's opencode.json, .opencode/ and plugins in",
    "--attach": "another OpenCode server runs with its own, not isolated, config",
}
_REFUSED_COMMANDS = {"attach": _REFUSED_OPTIONS["--attach"]}
_SUBCOMMANDS = frozenset(
    {
        "acp", "agent", "auth", "completion", "db", "debug", "export", "github", "import", "mcp",
        "models", "plugin", "pr", "providers", "run", "serve", "session", "stats", "uninstall", "upgrade", "web",
    }
)  # fmt: skip


class IsolationRefused(Exception):
    """OpenCode cannot be started isolated: the message names the source and what to do (one line)."""


def opencode_config(
    *, url: str, server_name: str, token: str | None, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Deny every native OpenCode tool and allow only this server's MCP tools (last matching rule wins);
    `extra` (a provider, a model) is merged in but can never loosen the permission map or add a server."""
    entry: dict[str, Any] = {"type": "remote", "url": url, "enabled": True, "oauth": False}
    if token is not None:
        entry["headers"] = {"Authorization": f"Bearer {token}"}
    config: dict[str, Any] = {"$schema": OPENCODE_SCHEMA, "autoupdate": False, "share": "disabled", **(extra or {})}
    # No formatter or language server: with local access an edit would otherwise run their programs.
    config.update(formatter=False, lsp=False)
    config["permission"] = {"*": "deny", f"{server_name}_*": "allow"}
    config["mcp"] = {server_name: entry}
    return config


def write_json_atomically(path: Path, data: Mapping[str, Any], *, mode: int = 0o600) -> None:
    """`data` as indented JSON, written atomically (`paths.write_file`): a reader sees the old file or the new one."""
    write_file(path.parent, path.name, (json.dumps(data, indent=2) + "\n").encode(), mode=mode)


def config_path(config_home: Path) -> Path:
    """Where OpenCode reads the global config of `XDG_CONFIG_HOME=config_home`."""
    return config_home / "opencode" / "opencode.json"


PLUGIN_LOCK = {"packages": {"": {"dependencies": {"@opencode-ai/plugin": "*"}}}}
"""A lock file that tells OpenCode the plugin SDK is already installed in a config folder: without it, every
start installs `@opencode-ai/plugin` from the npm registry into each config folder (in the background: about 27 MB
in 2,100 files and 8 s of CPU after the node says it is ready; with no registry reachable it waits about 100 s).
The isolated folder never holds a plugin that would need it. OpenCode 1.18.33 skips the install when the folder has
a `node_modules` and this lock lists every dependency its `package.json` names (its `Npm.install`)."""


def write_opencode_config(config_home: Path, config: Mapping[str, Any]) -> Path:
    """Write `<config_home>/opencode/opencode.json` atomically (folders private to the user)."""
    path = config_path(config_home)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_json_atomically(path, config)
    return path


def _user_opencode_dirs() -> set[Path]:
    homes = [Path.home() / ".config"]
    if os.environ.get("XDG_CONFIG_HOME"):
        homes.append(Path(os.environ["XDG_CONFIG_HOME"]))
    return {(home / "opencode").resolve() for home in homes}


class ConfigHome:
    """The folder an isolated OpenCode takes as `XDG_CONFIG_HOME`, for the bridge and every agent endpoint: a
    given folder is kept (and may never be the user's own config home), otherwise a temporary one is made at
    `write()` and removed at `remove()`."""

    def __init__(self, given: str | os.PathLike[str] | None, *, prefix: str) -> None:
        self.given = Path(given).resolve() if given is not None else None
        self.prefix = prefix
        self.root: Path | None = None

    @property
    def path(self) -> Path | None:
        """Its `opencode/opencode.json` (None until written)."""
        return None if self.root is None else config_path(self.root)

    def write(self, config: Mapping[str, Any]) -> Path:
        """Write `config` (see `opencode_config`); raises IsolationRefused for the user's own config home and
        OSError when the folder cannot be written."""
        if self.root is None:
            if self.given is not None and (self.given / "opencode").resolve() in _user_opencode_dirs():
                raise IsolationRefused(f"{self.given} is the user's own OpenCode config home; give a folder of its own")
            self.root = self.given or Path(tempfile.mkdtemp(prefix=self.prefix))
        return write_opencode_config(self.root, config)

    def env(self) -> dict[str, str] | None:
        """What an OpenCode process needs to see only this config: its own XDG_CONFIG_HOME (None before write)."""
        return None if self.root is None else {"XDG_CONFIG_HOME": str(self.root)}

    def remove(self) -> None:
        """Forget the folder; a temporary one is deleted."""
        if self.root is not None and self.given is None:
            shutil.rmtree(self.root, ignore_errors=True)
        self.root = None


def local_access_dir(config_home: Path) -> Path:
    return config_home / LOCAL_ACCESS_DIR


def write_local_grants(config_home: Path, grants: Sequence[tuple[str, float]]) -> None:
    """List the live grants as (grant id, expiry in epoch seconds) for the next launch (atomically)."""
    folder = local_access_dir(config_home)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_json_atomically(folder / _LOCAL_GRANTS, {"grants": [{"id": gid, "expires": exp} for gid, exp in grants]})


def _live_links(config_home: Path, now: float) -> list[Path]:
    """The links of the grants listed live at `now` (a malformed file or entry grants nothing)."""
    folder = local_access_dir(config_home)
    try:
        listed = json.loads((folder / _LOCAL_GRANTS).read_text(encoding="utf-8"))["grants"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    links = []
    for entry in listed if isinstance(listed, list) else []:
        gid, expires = (entry.get("id"), entry.get("expires")) if isinstance(entry, dict) else (None, None)
        if isinstance(gid, str) and _GRANT_ID.fullmatch(gid) and isinstance(expires, int | float) and expires > now:
            link = folder / gid
            if link.is_symlink() and link.is_dir():
                links.append(link)
    return links


def _opencode_worktree(workdir: Path) -> Path:
    """The worktree OpenCode takes for `workdir`: the enclosing git work tree, else `/`. Its read and edit rules
    match paths relative to it (see docs/local-access.md)."""
    for folder in (workdir, *workdir.parents):
        if (folder / ".git").exists():
            return folder
    return Path("/")


def local_access_rules(links: Sequence[Path], worktree: Path) -> dict[str, dict[str, str]]:
    """Permission rules letting OpenCode's read and edit tools (edit, write, apply_patch) into the `links` folders
    and nowhere else; every other tool stays under the deny-all."""
    inside = {os.path.relpath(link, worktree) + "/*": "allow" for link in links}
    return {
        "external_directory": {"*": "deny", **{f"{link}/*": "allow" for link in links}},
        "read": {"*": "deny", **inside},
        "edit": {"*": "deny", **inside},
    }


def seed_plugin_lock(folder: Path) -> None:
    """Spare OpenCode its plugin SDK install in the config folder `folder` (`PLUGIN_LOCK`): an empty `node_modules`
    and the lock file, unless one is there."""
    (folder / "node_modules").mkdir(exist_ok=True, mode=0o700)
    lock = folder / "package-lock.json"
    if not lock.exists():
        write_json_atomically(lock, PLUGIN_LOCK)


# -- the isolated launch ---------------------------------------------------------------------------------


@dataclass
class Launch:
    """How to start OpenCode isolated: the command, its whole environment and working folder, and what of
    the user's own configuration was left out (for the one stderr line)."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    dropped_keys: list[str] = field(default_factory=list)
    dropped_variables: list[str] = field(default_factory=list)
    user_config: str | None = None

    def notice(self) -> str | None:
        """One line saying what was left out, or None when nothing was."""
        parts = []
        if self.dropped_keys:
            parts.append(f"ignored {', '.join(self.dropped_keys)} from OPENCODE_CONFIG {self.user_config}")
        if self.dropped_variables:
            parts.append(f"unset {', '.join(self.dropped_variables)}")
        if not parts:
            return None
        return f"unit-mcp: isolated OpenCode: {'; '.join(parts)} (only provider, model and small_model are used)"


def _user_dirs(environ: Mapping[str, str]) -> dict[str, Path]:
    """The user's own XDG data, cache and state folders (OpenCode keeps credentials and sessions there)."""
    home = Path(environ.get("HOME") or Path.home())
    defaults = {"XDG_DATA_HOME": ".local/share", "XDG_CACHE_HOME": ".cache", "XDG_STATE_HOME": ".local/state"}
    return {
        name: Path(environ[name]) if environ.get(name) and os.path.isabs(environ[name]) else home / default
        for name, default in defaults.items()
    }


def _read_user_config(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise IsolationRefused(f"cannot read OPENCODE_CONFIG {path}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise IsolationRefused(
            f"OPENCODE_CONFIG {path} is not plain JSON ({exc}); give a JSON file with provider/model only"
        ) from exc
    if not isinstance(data, dict):
        raise IsolationRefused(f"OPENCODE_CONFIG {path} is not a JSON object")
    return data


def _check_credentials(data_home: Path, environ: Mapping[str, str]) -> None:
    """Refuse stored credentials that make OpenCode fetch config from a remote host, and an active account
    organisation (whose config OpenCode fetches too): neither can be turned off without hiding the user's keys."""
    sources: list[tuple[str, str]] = []
    auth = data_home / "opencode" / "auth.json"
    with contextlib.suppress(OSError):
        sources.append((str(auth), auth.read_text(encoding="utf-8")))
    if environ.get("OPENCODE_AUTH_CONTENT"):
        sources.append(("OPENCODE_AUTH_CONTENT", environ["OPENCODE_AUTH_CONTENT"]))
    for name, text in sources:
        try:
            entries = json.loads(text)
        except ValueError:
            continue
        if isinstance(entries, dict) and any(
            isinstance(entry, dict) and entry.get("type") == "wellknown" for entry in entries.values()
        ):
            raise IsolationRefused(
                f"{name} holds organisation credentials whose remote OpenCode config would be merged in; "
                "log out of that organisation (opencode auth logout) or use a separate XDG_DATA_HOME"
            )
    for database in sorted((data_home / "opencode").glob("opencode*.db")):
        try:
            with contextlib.closing(connect_sqlite(database, read_only=True, timeout=5)) as db:
                active = db.execute("SELECT 1 FROM account_state WHERE active_org_id IS NOT NULL").fetchone()
        except sqlite3.OperationalError as exc:
            if "no such" in str(exc):
                continue
            raise IsolationRefused(f"cannot read OpenCode's account state in {database}: {exc}") from exc
        if active is not None:
            raise IsolationRefused(
                f"{database} has an active OpenCode account organisation whose remote config would be merged in; "
                "switch it off (opencode account) or use a separate XDG_DATA_HOME"
            )


def _check_arguments(args: Sequence[str]) -> None:
    for arg in args:
        option = arg.split("=", 1)[0]
        if option in _REFUSED_OPTIONS:
            raise IsolationRefused(
                f"{option}: an isolated OpenCode runs in its own config folder; {_REFUSED_OPTIONS[option]} "
                "(the unit tools need neither)"
            )
    first = args[0] if args else None
    if first in _REFUSED_COMMANDS:
        raise IsolationRefused(f"{first}: {_REFUSED_COMMANDS[first]}; run the TUI itself (no arguments) instead")
    if first is not None and not first.startswith("-") and first not in _SUBCOMMANDS:
        raise IsolationRefused(
            f"{first!r} is not an OpenCode command; a project folder would bring that folder's config in "
            f"(commands: {', '.join(sorted(_SUBCOMMANDS))})"
        )


def find_opencode(environ: Mapping[str, str]) -> Path:
    """The OpenCode binary: $OPENCODE_PATH, else `opencode` on PATH."""
    for candidate in (environ.get("OPENCODE_PATH"), shutil.which("opencode", path=environ.get("PATH"))):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return Path(candidate).resolve()
    raise IsolationRefused(
        f"no opencode binary: set OPENCODE_PATH or put opencode on PATH "
        f"(npm install --prefix DIR opencode-ai@{OPENCODE_VERSION} gives DIR/node_modules/.bin/opencode)"
    )


def check_version(binary: Path, launch_dir: Path, env: Mapping[str, str]) -> None:
    """Refuse another OpenCode version: the isolation is verified against the pinned one only. The answer is
    remembered per binary (path, size, mtime) so a launch pays for `--version` once."""
    stat = binary.stat()
    key = {"binary": str(binary), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    stamp = launch_dir / _VERSION_STAMP
    with contextlib.suppress(OSError, ValueError):
        known = json.loads(stamp.read_text(encoding="utf-8"))
        if {k: known.get(k) for k in key} == key and known.get("version") == OPENCODE_VERSION:
            return
    try:
        done = subprocess.run(
            [str(binary), "--version"], env=dict(env), cwd=launch_dir, capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise IsolationRefused(f"{binary} --version failed: {exc}") from exc
    version = done.stdout.strip()
    if version != OPENCODE_VERSION:
        raise IsolationRefused(
            f"{binary} is OpenCode {version or '(no version)'}; the isolation is verified for {OPENCODE_VERSION} "
            f"only: install it (npm install --prefix DIR opencode-ai@{OPENCODE_VERSION}) and set OPENCODE_PATH"
        )
    with contextlib.suppress(OSError):
        write_json_atomically(stamp, {**key, "version": version})


def plan_launch(config_home: Path, args: Sequence[str], environ: Mapping[str, str]) -> Launch:
    """The isolated launch of `opencode ARGS…` for the deny-all config under `config_home`, or
    IsolationRefused naming the source that cannot be kept out."""
    _check_arguments(args)
    isolated_path = config_path(config_home)
    try:
        isolated = json.loads(isolated_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise IsolationRefused(f"cannot read the isolated config {isolated_path} (is the server running?)") from exc
    if not isinstance(isolated, dict) or not isolated.get("permission") or not isolated.get("mcp"):
        raise IsolationRefused(f"{isolated_path} is not a deny-all config written by unit-mcp")
    binary = find_opencode(environ)
    user_dirs = _user_dirs(environ)
    _check_credentials(user_dirs["XDG_DATA_HOME"], environ)

    content: dict[str, Any] = {}
    dropped_keys: list[str] = []
    user_config = environ.get("OPENCODE_CONFIG") or None
    if user_config is not None:
        data = _read_user_config(user_config)
        content = {key: data[key] for key in USER_KEYS if key in data}
        dropped_keys = [key for key in data if key not in USER_KEYS and key != "$schema"]
    for key in ("permission", "mcp", "autoupdate", "share", "formatter", "lsp"):
        if key in isolated:
            content[key] = isolated[key]

    launch_dir = config_home / _LAUNCH_DIR
    home, managed = launch_dir / "home", launch_dir / "managed"
    for folder in (home, managed):
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    for folder in user_dirs.values():
        folder.mkdir(parents=True, exist_ok=True)
    workdir = isolated_path.parent
    seed_plugin_lock(workdir)
    links = _live_links(config_home, time.time())
    if links:
        content["permission"] = {**content["permission"], **local_access_rules(links, _opencode_worktree(workdir))}

    env = {key: value for key, value in environ.items() if not key.startswith("OPENCODE_") or key in KEPT_VARIABLES}
    dropped_variables = sorted(key for key in environ if key not in env and key != "OPENCODE_PATH")
    env.update({name: str(path) for name, path in user_dirs.items()})
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(config_home),
        PWD=str(workdir),
        OPENCODE_TEST_HOME=str(home),
        OPENCODE_TEST_MANAGED_CONFIG_DIR=str(managed),
        OPENCODE_CONFIG_CONTENT=json.dumps(content),
    )
    env.update(ISOLATION_FLAGS)
    check_version(binary, launch_dir, env)
    return Launch(
        argv=[str(binary), *args],
        env=env,
        cwd=workdir,
        dropped_keys=dropped_keys,
        dropped_variables=dropped_variables,
        user_config=user_config,
    )


def launcher_script(config_home: Path, python: str | None = None) -> str:
    """A POSIX shell script that runs `main()` for `config_home` with this Python, isolated from the
    caller's Python path and working folder (`-I`), passing its arguments on unchanged."""
    python = python or sys.executable
    command = [python, "-I", "-m", "unit_mcp.opencode_isolation", str(config_home)]
    head = "#!/bin/sh\n# OpenCode isolated for one unit-mcp server (written by unit-mcp)\n"
    return f'{head}exec {shlex.join(command)} "$@"\n'


def write_launcher(path: Path, config_home: Path) -> Path:
    """Write the executable behind OPENCODE_CMD (atomically, mode 0700)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_file(path.parent, path.name, launcher_script(config_home).encode(), mode=0o700)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m unit_mcp.opencode_isolation CONFIG_HOME [OPENCODE ARGS…]`: replace this process with an
    isolated OpenCode, or say in one line why not (exit status 2)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(
            "unit-mcp: usage: python -m unit_mcp.opencode_isolation CONFIG_HOME [opencode arguments]", file=sys.stderr
        )
        return 2
    try:
        launch = plan_launch(Path(args[0]), args[1:], os.environ)
    except IsolationRefused as exc:
        print(f"unit-mcp: refusing to start OpenCode: {exc}", file=sys.stderr)
        return 2
    notice = launch.notice()
    if notice is not None:
        print(notice, file=sys.stderr, flush=True)
    os.chdir(launch.cwd)
    os.execve(launch.argv[0], launch.argv, launch.env)
    return 0  # pragma: no cover (execve does not return)


if __name__ == "__main__":
    sys.exit(main())
