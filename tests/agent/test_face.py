"""The face of `unit_mcp.agent`: a small set of names a runner's user needs, each resolving, loaded lazily."""

from __future__ import annotations

import subprocess
import sys

import unit_mcp.agent as face


def test_every_public_name_resolves_and_the_face_stays_small() -> None:
    assert sorted(face.__all__) == sorted(face._EXPORTS)
    for name in face.__all__:
        assert getattr(face, name) is not None
    assert len(face.__all__) <= 30, "internals are imported from their modules, not added to the face"


def test_importing_the_face_loads_neither_sdk() -> None:
    """Browsing sessions from the command line must not pay for the MCP SDK or the OpenAI SDK."""
    code = "import sys, unit_mcp.agent; print(sorted(m for m in ('mcp', 'openai', 'starlette') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
