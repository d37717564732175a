"""runtime.lock: the pinned runtime wheels and their sha256, as pip reads them (--require-hashes).

One line per wheel, `name==version --hash=sha256:<hex>  # <file name>`, under a header that
names the Python tag and platform the wheels are for (scripts/lock_runtime.py writes it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from narwhal.core.errors import InputError, Problem

LINE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[A-Za-z0-9.+!_-]+) "
                  r"--hash=sha256:(?P<sha>[0-9a-f]{64})(?:\s+#\s*(?P<file>\S+))?$")
HEADER = re.compile(r"^# (?P<key>python|platform): (?P<value>\S+)$")


def normalized(name: str) -> str:
    """PEP 503 name: `pydantic_core` and `Pydantic-Core` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    sha256: str
    file: str | None

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}"


@dataclass(frozen=True)
class Lock:
    python: str  # cp311
    platform: str  # manylinux_x86_64
    pins: tuple[Pin, ...]

    @property
    def python_minor(self) -> tuple[int, int]:
        digits = self.python.removeprefix("cp")
        return int(digits[0]), int(digits[1:])


def parse_lock(text: str, where: str = "runtime.lock") -> Lock:
    """The lock, or every problem in it (a line pip would read differently, a repeated pin)."""
    header: dict[str, str] = {}
    pins: list[Pin] = []
    problems: list[Problem] = []
    seen: set[str] = set()
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if m := HEADER.match(line):
                header[m["key"]] = m["value"]
            continue
        m = LINE.match(line)
        if m is None:
            problems.append(Problem(f"{where}:{n}", f"not a pinned, hashed wheel: {line[:80]!r}",
                                    "regenerate it with scripts/lock_runtime.py"))
            continue
        key = normalized(m["name"])
        if key in seen:
            problems.append(Problem(f"{where}:{n}", f"{m['name']} is pinned twice",
                                    "regenerate it with scripts/lock_runtime.py"))
        seen.add(key)
        pins.append(Pin(key, m["version"], m["sha"], m["file"]))
    for key in ("python", "platform"):
        if key not in header:
            problems.append(Problem(where, f"the header names no {key}",
                                    "regenerate it with scripts/lock_runtime.py"))
    if not re.fullmatch(r"cp3\d{1,2}", header.get("python", "cp311")):
        problems.append(Problem(where, f"python {header['python']!r} is not a CPython tag",
                                "regenerate it with scripts/lock_runtime.py"))
    if problems:
        raise InputError(where, problems)
    return Lock(header["python"], header["platform"], tuple(pins))


def load_lock(path: Path) -> Lock:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(str(path), [Problem(str(path), f"unreadable: {exc}",
                                             "run from a Narwhal checkout")]) from None
    return parse_lock(text, str(path))
