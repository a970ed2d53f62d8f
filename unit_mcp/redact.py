"""Keep host paths out of everything a client sees: messages, tracebacks, test output, log lines."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterable
from pathlib import Path


class Redactor:
    """Replaces known absolute roots (longest first) with short placeholders such as `<units>`.

    The default roots (site-packages, the temporary folder...) are worked out at the first use: the test host
    builds a Redactor on every run and usually never redacts anything."""

    def __init__(self, roots: Iterable[tuple[Path | str, str]]) -> None:
        self._roots = list(roots)

    @functools.cached_property
    def _pairs(self) -> list[tuple[str, str]]:
        import sysconfig
        import tempfile

        pairs: dict[str, str] = {}
        defaults: list[tuple[Path | str, str]] = [
            (Path(__file__).resolve().parent, "<unit_mcp>"),
            (sysconfig.get_paths()["purelib"], "<site-packages>"),
            (sysconfig.get_paths()["stdlib"], "<stdlib>"),
            (sys.prefix, "<python>"),
            (sys.base_prefix, "<python>"),
            (tempfile.gettempdir(), "<tmp>"),
            (Path.home(), "~"),
        ]
        for root, label in [*self._roots, *defaults]:
            for variant in {str(root), os.path.realpath(root)}:
                if len(variant) > 1 and variant not in pairs:
                    pairs[variant] = label
        return sorted(pairs.items(), key=lambda item: len(item[0]), reverse=True)

    def __call__(self, text: str) -> str:
        for root, label in self._pairs:
            if root in text:
                text = text.replace(root, label)
        return text
