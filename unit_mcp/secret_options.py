"""Secret command-line options: every local user reads argv through /proc, so a secret comes from its environment
variable or a file only its owner can read (`--X-file`), and the bare `--X VALUE` is refused in one line."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .paths import read_secret


class _Refused(argparse.Action):
    """`--X VALUE`: end at once with what to use instead (the value is never kept)."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, refusal: str, **options: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, **options)
        self.refusal = refusal

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        parser.exit(2, f"{parser.prog}: error: {self.refusal}\n")


def add_secret_option(parser: argparse.ArgumentParser, option: str, *, env: Sequence[str], what: str) -> None:
    """`{option}-file FILE` (dest `<name>_file`), and `{option}` refused with the variable and the file to use."""
    name = env[0]
    refusal = (
        f"{option} puts the {what} where every local user can read it (/proc/PID/cmdline); "
        f"set {name} or give {option}-file FILE (mode 0600)"
    )
    parser.add_argument(option, action=_Refused, refusal=refusal)
    parser.add_argument(
        f"{option}-file",
        type=Path,
        metavar="FILE",
        help=f"read the {what} from FILE (yours, mode 0600; default: ${name}"
        + "".join(f" or ${other}" for other in env[1:])
        + ")",
    )


def secret_value(file: Path | None, option: str, env: Sequence[str]) -> str | None:
    """The secret from `{option}-file`, else the first of the `env` variables that is set; `UnsafeSecret` if the
    file is not ours alone."""
    if file is not None:
        return read_secret(file, f"{option}-file")
    return next((os.environ[name] for name in env if os.environ.get(name)), None)
