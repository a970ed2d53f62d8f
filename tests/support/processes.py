"""What the tests ask of a process by its pid (Linux /proc)."""

from __future__ import annotations

from pathlib import Path


def running(pid: int) -> bool:
    """The process is there and neither a zombie nor dead: a killed orphan may linger as a zombie until init reaps
    it, and that is not running."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
