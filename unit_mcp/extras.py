"""The optional parts of the install (`pip install 'unit-mcp[agent]'`): a command that needs a missing one ends
with one line naming the extra to install, before an import of it could fail with a traceback."""

from __future__ import annotations

import importlib.util

EXTRAS = {
    "agent": ("openai", "httpx", "httpx2"),
    "postgres": ("psycopg",),
    "durable": ("dbos", "sqlalchemy"),
    "otel": ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"),
}
"""The modules each extra of `pyproject.toml` installs that the package imports."""


def require_extra(extra: str, prog: str) -> None:
    """End the command (exit status 1, one line on stderr) unless every module of `extra` can be imported."""
    missing = [name for name in EXTRAS[extra] if not _found(name)]
    if missing:
        raise SystemExit(
            f"{prog}: error: needs the {extra} extra ({', '.join(missing)} not installed); install 'unit-mcp[{extra}]'"
        )


def _found(module: str) -> bool:
    """Whether `module` can be imported; a dotted name whose parent package is missing is not (find_spec raises)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False
