"""Tool names as OpenAI-style function calling accepts them, derived the same way everywhere (a pure
function, so a session's history maps back to the same names without the surface at hand)."""

from __future__ import annotations

import hashlib
import re

_OPENAI_NAME = re.compile(r"[^A-Za-z0-9_-]")


def openai_tool_name(name: str) -> str:
    """A name OpenAI-style function calling accepts (`[A-Za-z0-9_-]`, at most 64 characters). Valid names
    pass unchanged; others are sanitised and suffixed with a hash of the original, so they stay distinct."""
    if len(name) <= 64 and not _OPENAI_NAME.search(name):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{_OPENAI_NAME.sub('_', name)[:55]}_{digest}"
