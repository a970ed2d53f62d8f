"""Keep host paths and the server's secrets out of everything a client sees: messages, tracebacks, test output,
log lines."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterable
from pathlib import Path

MIN_SECRET = 6
"""A shorter secret is not hidden: replacing it everywhere would garble text and tell what it is."""


class Redactor:
    """Replaces known absolute roots (longest first) with short placeholders such as `<units>`.

    The default roots (site-packages, the temporary folder...) are worked out at the first use: the test host
    builds a Redactor on every run and usually never redacts anything."""

    def __init__(self, roots: Iterable[tuple[Path | str, str]]) -> None:
        self._roots = list(roots)
        self._secrets: dict[str, tuple[str, str]] = {}  # slot -> (secret, label)

    def hide(self, secret: str | None, label: str = "<secret>", *, slot: str | None = None) -> None:
        """Replace `secret` (the bearer token, a login token, a database password) by `label` from now on, wherever
        it appears: a unit's test runs as the server's user and can read what the server wrote to disk. A secret
        hidden in a `slot` replaces the one hidden there before (the page's one live login link)."""
        if secret and len(secret) >= MIN_SECRET:
            self._secrets[secret if slot is None else slot] = (secret, label)

    @functools.cached_property
    def _pairs(self) -> list[tuple[str, str]]:
        import sysconfig
        import tempfile

        pairs: dict[str, str] = {}
        defaults: list[tuple[Path | str, str]] = [
            (Path(__file__).resolve().parent, "<unit_mcp>"),
            (sysconfig.get_paths()["purelib"], "<site-packages>"),
            # where unit_mcp is imported from (site-packages, or a checkout when installed editable): a test's
            # PYTHONPATH names it
            (Path(__file__).resolve().parent.parent, "<unit_mcp>/.."),
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
        for secret, label in list(self._secrets.values()):
            if secret in text:
                text = text.replace(secret, label)
        for root, label in self._pairs:
            if root in text:
                text = text.replace(root, label)
        return text
