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
    code = "\n".join([
        "import sys, unit_mcp.agent",
        "def lean(module):  # a package unit_mcp registered without running its __init__ (the hook is ours)",
        "    hook = vars(module).get('__getattr__')",
        "    return (getattr(hook, '__module__', None) or '').split('.')[0] == 'unit_mcp'",
        "sdks = ('mcp', 'mcp_types', 'openai', 'starlette')",
        "print(sorted(name for name, module in list(sys.modules.items())",
        "             if name.split('.')[0] in sdks and not lean(module)))",
    ])  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]", "importing the agent face loaded these SDK modules"
