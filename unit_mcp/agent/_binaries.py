"""Finding the provider binaries (OpenCode, Codex): the path given, else an environment variable, else PATH."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def find_binary(
    name: str, env_var: str, explicit: str | os.PathLike[str] | None, *, error: type[Exception], install: str
) -> Path:
    """The executable `name`: `explicit`, else $`env_var`, else `name` on PATH; else `error` saying where it
    looked and how to install it (`install`)."""
    candidates: list[tuple[str, str | None]] = [
        ("the path given", os.fspath(explicit) if explicit is not None else None),
        (f"${env_var}", os.environ.get(env_var)),
        ("PATH", shutil.which(name)),
    ]
    for _, candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return Path(candidate)
    looked = ", ".join(f"{where} ({value or 'unset'})" for where, value in candidates)
    raise error(f"no executable {name} binary found; looked at {looked}. {install}")
