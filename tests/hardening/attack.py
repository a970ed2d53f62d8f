"""The ground an attacker stands on: files outside the unit that must never be read or written, symlinks that
point at them from inside, and a corpus of hostile source ids.

Reads are detected twice: every sentinel holds a random secret that must never appear in a response, and its
access time is set a day behind its modification time, so that any read moves it (the kernel updates atime on
a read while atime <= mtime, under `relatime` and `strictatime` alike). A control file proves the atime probe
works on this filesystem before it is trusted.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

DAY = 86400


@dataclass
class Ground:
    """The tree around a target unit: `outside` files, a sibling unit, symlinks planted inside the unit."""

    root: Path  # tmp_path: everything the test owns
    units: Path
    unit: str
    secret: str
    sentinels: list[Path] = field(default_factory=list)

    @property
    def unit_dir(self) -> Path:
        return self.units / self.unit

    @property
    def outside(self) -> Path:
        return self.root / "outside"

    def arm(self) -> None:
        """Push every sentinel's atime behind its mtime; call after anything legitimate has read them."""
        for path in self.sentinels:
            st = path.stat()
            os.utime(path, ns=(st.st_mtime_ns - DAY * 10**9, st.st_mtime_ns))

    def read_sentinels(self) -> list[str]:
        """Sentinels whose atime moved since `arm()`: files something read."""
        return [
            str(path.relative_to(self.root))
            for path in self.sentinels
            if path.stat().st_atime_ns >= path.stat().st_mtime_ns
        ]

    def atime_probe_works(self) -> bool:
        probe = self.root / "atime-probe.txt"
        probe.write_text("probe")
        st = probe.stat()
        os.utime(probe, ns=(st.st_mtime_ns - DAY * 10**9, st.st_mtime_ns))
        probe.read_bytes()
        moved = probe.stat().st_atime_ns >= st.st_mtime_ns
        probe.unlink()
        return moved

    def tree(self, *, skip: tuple[str, ...] = ("data",)) -> dict[str, str]:
        """Every entry under the test's root (but `skip` and caches) with what it is: a fingerprint of writes.

        Symlinks are recorded by target and never followed; files by size and content hash (reading them
        moves their atime: take `read_sentinels()` first)."""
        entries: dict[str, str] = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            rel_dir = Path(dirpath).relative_to(self.root)
            if rel_dir.parts and rel_dir.parts[0] in skip:
                dirnames[:] = []
                continue
            dirnames[:] = [name for name in dirnames if name != "__pycache__"]
            for name in [*dirnames, *filenames]:
                path = Path(dirpath) / name
                rel = str(rel_dir / name)
                if path.is_symlink():
                    entries[rel] = "link -> " + os.readlink(path)
                elif path.is_dir():
                    entries[rel] = "dir"
                elif path.is_file():
                    entries[rel] = f"file {hashlib.sha256(path.read_bytes()).hexdigest()}"
                else:
                    entries[rel] = "special"
        return entries


def plant(root: Path, units: Path, unit: str = "counter") -> Ground:
    """Sentinels outside the unit and symlinks inside it that point at them (and at the rest of the host)."""
    ground = Ground(root, units, unit, secret=f"SENTINEL-{secrets.token_hex(12)}")
    outside = ground.outside
    (outside / "sub").mkdir(parents=True)
    sibling = units / f"{unit}_evil"  # a prefix sibling: `<units>/counter_evil` beside `<units>/counter`
    sibling.mkdir()
    units_sibling = root / f"{units.name}_evil"  # and `<tmp>/units_evil` beside the units root
    units_sibling.mkdir()
    secret_unit = root / "outside_unit"
    secret_unit.mkdir()
    for path, body in [
        (outside / "secret.py", "TOKEN = '{secret}'\n"),
        (outside / "secret.txt", "{secret}\n"),
        (outside / "sub" / "deep.txt", "{secret} deep\n"),
        (sibling / "__init__.py", "SECRET = '{secret}'\n"),
        (sibling / "x.py", "SECRET = '{secret}'\n"),
        (units_sibling / "x.py", "SECRET = '{secret}'\n"),
        (secret_unit / "__init__.py", "SECRET = '{secret}'\n"),
    ]:
        path.write_text(body.format(secret=ground.secret))
        ground.sentinels.append(path)
    inside = ground.unit_dir
    (inside / "deep").mkdir()
    links = {
        inside / "evil.py": outside / "secret.py",
        inside / "evil_rel.py": Path("../../outside/secret.py"),
        inside / "evil.txt": outside / "secret.txt",
        inside / "link_out": outside,
        inside / "link_root": Path("/"),
        inside / "link_sibling": Path(f"../{unit}_evil"),
        inside / "link_up": Path(".."),
        inside / "deep" / "link_out": outside,
        inside / "dangling.py": outside / "created_by_attack.py",
        inside / "dangling_dir": outside / "created_dir",
        inside / "loop.py": Path("loop.py"),
        units / "linked_unit": secret_unit,
        units / "linked_file.py": outside / "secret.py",
    }
    for link, target in links.items():
        link.symlink_to(target)
    os.mkfifo(inside / "pipe.py")
    return ground


def _dedupe(items: list[tuple[str, str]]) -> list[tuple[str, str]]:
    seen: set[str] = set()
    out = []
    for category, source_id in items:
        if source_id not in seen:
            seen.add(source_id)
            out.append((category, source_id))
    return out


def hostile_source_ids(ground: Ground) -> list[tuple[str, str]]:
    """(category, source id) pairs; every one must be refused by every tool that takes a source id."""
    unit, units, outside = ground.unit, ground.units, ground.outside
    targets = ["x.py", "etc/passwd", f"{unit}_evil/x.py", "outside/secret.txt", "greeter.py"]
    climbs = ["..", "../..", "../../..", "../../../../../../..", "./..", "a/..", "a/../..", "x/./../..", "a/b/../../.."]
    corpus: list[tuple[str, str]] = [("traversal", climb) for climb in climbs]
    corpus += [("traversal", f"{climb}/{target}") for climb in climbs for target in targets]
    corpus += [
        ("traversal", spelling)
        for spelling in [
            "../", "..//x.py", "..///x.py", ".././x.py", "./../x.py", ".../x.py", "..../x.py", "...", "....",
            "..;/x.py", "x/..", "x/../..", "x/../../x.py", "__init__.py/../../x.py", "../.", "/..", ".. /x.py",
            "../ x.py", "..\t/x.py", "..?/x.py", "..#/x.py", "../__init__.py", f"../{unit}/__init__.py",
        ]
    ]  # fmt: skip
    corpus += [
        ("absolute", spelling)
        for spelling in [
            "/", "//", "///", "/etc/passwd", "//etc/passwd", "///etc/passwd", "/etc/shadow", "/proc/self/environ",
            "/proc/self/cwd/x.py", "/proc/self/root/etc/passwd", "/dev/zero", "/dev/stdin", "/tmp/x.py",
            str(outside / "secret.txt"), str(outside / "secret.py"), str(units / f"{unit}_evil" / "x.py"),
            str(units / unit / "__init__.py"), str(units / unit) + "_evil/x.py", str(units) + "_evil/x.py",
            str(ground.root / "outside_unit" / "__init__.py"), "file:///etc/passwd", "file:/etc/passwd",
            "C:\\Windows\\win.ini", "C:/x.py", "c:x.py", "\\\\server\\share\\x.py", "\\\\?\\C:\\x.py",
            "~", "~/x.py", "~root/.ssh/id_rsa", "$HOME/x.py", "${HOME}/x.py", "%USERPROFILE%\\x.py", "$(id)",
            "`id`", "x.py;id", "x.py|id", "x.py&&id", "-rf", "--help", "-",
        ]
    ]  # fmt: skip
    corpus += [
        ("nul", spelling)
        for spelling in [
            "\x00", "x.py\x00", "__init__.py\x00", "__init__.py\x00.txt", "\x00../x.py", "..\x00/x.py",
            "a/\x00/b.py", "x\x00/../../x.py", f"../{unit}_evil/x.py\x00__init__.py",
        ]
    ]  # fmt: skip
    corpus += [
        ("control", spelling)
        for spelling in [
            "\n", "x\n.py", "x.py\n", "x\r\n.py", "\t", "x\x7f.py", "\x1b[31mx.py", "x .py", " x.py", "x.py ",
            ".py", ".hidden.py", ".git/config", "x*", "x?.py", "[x].py", "x:y.py", 'x"y.py',
            "x'y.py", "x<y.py", "x>y.py", "x,y.py", "x=y.py", "x@y.py", "x!y.py", "x{y}.py", "x+y.py",
        ]
    ]  # fmt: skip
    corpus += [
        ("backslash", spelling)
        for spelling in [
            "\\", "\\x.py", "\\\\x.py", "..\\x.py", "..\\..\\x.py", "a\\..\\..\\x.py", "..\\/x.py", "../\\x.py",
            f"..\\{unit}_evil\\x.py", "x\\", "__init__.py\\", "deep\\..\\..\\x.py",
        ]
    ]  # fmt: skip
    corpus += [
        ("percent", spelling)
        for spelling in [
            "%2e%2e/x.py", "%2e%2e%2fx.py", "%2E%2E%2Fx.py", "..%2fx.py", "..%2Fx.py", "..%5cx.py", "%2e./x.py",
            ".%2e/x.py", "%2e%2e%5cx.py", "%252e%252e%252fx.py", "..%252fx.py", "%252e%252e/x.py",
            "%25252e%25252e%25252fx.py", "%c0%ae%c0%ae/x.py", "..%c0%afx.py", "..%c1%9cx.py", "%e0%80%ae%e0%80%ae/x.py",
            "..%00/x.py", "x.py%00.txt", "%00", "%", "%%32%65%%32%65/x.py", "%u002e%u002e/x.py", "..%u2215x.py",
            f"..%2f{unit}_evil%2fx.py",
        ]
    ]  # fmt: skip
    dots = ["\u2024", "\uff0e", "\u3002", "\ufe52", "\u00b7", "\u2027", "\u22c5", "\u0701", "\ua4f8"]
    slashes = ["\u2044", "\u2215", "\uff0f", "\u29f8", "\u2571", "\u0338", "\u2cc6", "\u3033"]
    backslashes = ["\uff3c", "\ufe68", "\u2216", "\u29f5", "\u29f9", "\u2572"]
    corpus += [("unicode", f"{dot}{dot}/x.py") for dot in dots]
    corpus += [("unicode", f"..{slash}x.py") for slash in slashes]
    corpus += [("unicode", f"..{slash}{unit}_evil{slash}x.py") for slash in slashes[:3]]
    corpus += [("unicode", f"{dot}{dot}{slash}x.py") for dot, slash in zip(dots, slashes, strict=False)]
    corpus += [("unicode", f"..{back}x.py") for back in backslashes]
    corpus += [
        ("unicode", spelling)
        for spelling in [
            "\u2025/x.py", "\u2025\u2215x.py", "\u2026/x.py", "\uff0e\uff0e\uff0fetc\uff0fpasswd",
            "\u200b../x.py", ".\u200b./x.py", "..\u200b/x.py", "\ufeff../x.py", "\u202e../x.py", "..\u2060/x.py",
            ".\u0307./x.py", "\u2024\u2024\u2044\u2024\u2024\u2044x.py", "x\u2024py", "__init__\uff0epy",
            "__\u0456nit__.py", "\u0441ounter/x.py", "\uff58.py", "x.p\u0443", "\U0001d431.py", "x\u00a0.py",
            "x\u3000.py", "\u00e9.py", "caf\u00e9/x.py",
        ]
    ]  # fmt: skip
    corpus += [
        ("prefix_sibling", spelling)
        for spelling in [
            f"../{unit}_evil/x.py", f"../{unit}_evil/__init__.py", f"../{unit}_evil", f"../{unit}_evil/",
            f"../{unit}_evil/../{unit}_evil/x.py", f"../{unit}x/x.py", f"../{unit}-evil/x.py",
            f"../{unit}/../{unit}_evil/x.py",
            f"../../{units.name}_evil/x.py", f"../../{units.name}_evil", f"./../{unit}_evil/x.py",
            f"{unit}_evil/../../{unit}_evil/x.py", f"..//{unit}_evil//x.py",
        ]
    ]  # fmt: skip
    corpus += [
        ("overlong", spelling)
        for spelling in [
            "a" * 256, "a" * 252 + ".py.", "a" * 300 + ".py", "/".join(["a"] * 513), "/".join(["abcdefgh"] * 120),
            ("a" * 255 + "/") * 4 + "x.py", "x" * 10_000, "a/" * 600 + "x.py", "\u00e9" * 128, "\U0001f600" * 64,
            "../" * 400 + "etc/passwd", "a" * 1025,
        ]
    ]  # fmt: skip
    corpus += [
        ("symlink", spelling)
        for spelling in [
            "evil.py", "evil_rel.py", "evil.txt", "link_out/secret.txt", "link_out/secret.py", "link_out/sub/deep.txt",
            "link_out/new.py", "link_out/sub/new.py", "link_out/created/new.py", "link_root/etc/passwd",
            "link_root/etc/hostname", "link_root/tmp/new.py", "link_sibling/x.py", "link_sibling/__init__.py",
            "link_sibling/new.py", f"link_up/{unit}_evil/x.py", "link_up/greeter.py", "link_up/new.py",
            "deep/link_out/secret.txt", "deep/link_out/new.py", "dangling.py", "dangling_dir/x.py", "loop.py",
            "loop.py/x.py", "link_out", "link_root", "deep/link_out",
        ]
    ]  # fmt: skip
    corpus += [
        ("special_file", spelling)
        for spelling in ["pipe.py", "pipe.py/x.py", "deep", "deep/", "__pycache__/x.pyc", "__pycache__"]
    ]
    return _dedupe(corpus)


HOSTILE_UNIT_IDS = [
    "", ".", "..", "../counter", "counter/..", "counter/", "/counter", "counter/__init__.py", "units.counter",
    "counter.py", "counter\x00", "\x00", "Counter ", " counter", "counter\n", "c\u043eunter", "\uff43ounter",
    "counter_evil/../counter", "__import__('os')", "os.system", "x" * 200, "class", "None", "1counter", "count-er",
    "linked_unit", "linked_file", "%2e%2e", "~", "$HOME",
]  # fmt: skip
