"""The stage kit: the locked wheels a host needs to run huggingface_hub before Gate B.

Staging happens in Gate A, before Narwhal is installed anywhere, yet the hosts download with
the official hub client. The kit is that client and what it requires, taken from the
revision's runtime.lock and its verified wheelhouse (the wheels Gate B installs from later),
so a host runs exactly the client version Narwhal is locked to. Which pins belong to it is
worked out from each wheel's own Requires-Dist, with markers judged for the lock's Python
and platform; the host script checks each wheel's sha256 before unpacking it.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

from narwhal.core.documents import sha256_bytes
from narwhal.deploy.package import wheelhouse
from narwhal.deploy.package.lock import Lock, Pin, normalized, parse_lock

ROOT = "huggingface-hub"


def marker_environment(lock: Lock) -> dict[str, str]:
    """The hosts' side of every environment marker, as the lock's header names them."""
    major, minor = lock.python_minor
    return {"python_version": f"{major}.{minor}", "python_full_version": f"{major}.{minor}.0",
            "platform_machine": "x86_64", "sys_platform": "linux", "platform_system": "Linux",
            "os_name": "posix", "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "extra": ""}


def closure(requires: Callable[[str], list[str]], root: str, env: Mapping[str, str],
            locked: set[str]) -> list[str]:
    """Every locked package root needs on the hosts, root first; a requirement whose marker
    is false there (another platform, an older Python, an extra) is left out."""
    order, todo = [], [normalized(root)]
    while todo:
        name = todo.pop(0)
        if name in order:
            continue
        if name not in locked:
            raise ValueError(f"{name} is needed by the hub client but not in runtime.lock")
        order.append(name)
        for text in requires(name):
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate(dict(env)):
                todo.append(normalized(req.name))
    return order


def wheel_requires(path: Path) -> list[str]:
    """A wheel's Requires-Dist lines, read from its METADATA."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode("utf-8", "replace")
    head = text.split("\n\n", 1)[0]
    return [line.split(":", 1)[1].strip() for line in head.splitlines()
            if line.startswith("Requires-Dist:")]


@dataclass(frozen=True)
class Kit:
    """The wheels to send (file name, local path, sha256), and the kit's digest (its folder)."""

    wheels: tuple[tuple[str, Path, str], ...]

    @property
    def digest(self) -> str:
        text = "".join(f"{name}\t{sha}\n" for name, _, sha in self.wheels)
        return hashlib.sha256(text.encode()).hexdigest()

    def archive(self, folder: Path) -> Path:
        """The wheels as one stored zip (built once per kit): sent as one file, so a host
        costs a few round trips instead of a few per wheel. Byte-stable: fixed order and
        times, so its sha256 names it."""
        path = folder / f"hub-kit-{self.digest[:16]}.zip"
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            part = path.with_suffix(f".part-{os.getpid()}")
            with zipfile.ZipFile(part, "w", zipfile.ZIP_STORED) as z:
                for name, local, _ in self.wheels:
                    z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)),
                               local.read_bytes())
            os.replace(part, path)
        return path


def build(lock: Lock, wheels: Mapping[Pin, Path]) -> Kit:
    """The kit from a verified wheelhouse (wheelhouse.verify/build's answer)."""
    by_name = {normalized(pin.name): (pin, path) for pin, path in wheels.items()}
    names = closure(lambda n: wheel_requires(by_name[n][1]), ROOT, marker_environment(lock),
                    set(by_name))
    return Kit(tuple((by_name[n][1].name, by_name[n][1], by_name[n][0].sha256) for n in names))


def for_checkout(runs: Path, lock_path: Path, given: Path | None) -> Kit:
    """The kit from this Narwhal's own runtime.lock (the stage script is shipped from the
    same checkout, as the host probe is: the client and its caller always match), with the
    wheels from `given`, else from Gate B's wheelhouse cache under RUNS (built once, where a
    package index answers)."""
    lock_bytes = lock_path.read_bytes()
    lock = parse_lock(lock_bytes.decode("utf-8", "replace"), str(lock_path))
    if given is not None:
        return build(lock, wheelhouse.verify(given, lock))
    return build(lock, wheelhouse.build(runs / "wheelhouse" / sha256_bytes(lock_bytes)[:16],
                                        lock_path, lock))
