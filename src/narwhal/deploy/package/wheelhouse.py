"""The runtime wheelhouse: one wheel per pin of runtime.lock, each checked by sha256.

Hosts install from it with no index (`pip --no-index --require-hashes`), so it is checked
whole on the workstation first: a missing pin or a file whose hash differs from the lock is
named before anything is sent. It is built once (`pip download` against the lock, which
needs an index) into a cache keyed by the lock's digest, or given with `--wheelhouse DIR`
for a workstation without an index.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from narwhal.core.errors import InputError, Problem
from narwhal.deploy.package.lock import Lock, Pin, normalized

BUILD_TIMEOUT_S = 900


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _name_version(wheel: Path) -> tuple[str, str]:
    parts = wheel.name.split("-")
    return (normalized(parts[0]), parts[1]) if len(parts) >= 5 else ("", "")


def verify(directory: Path, lock: Lock) -> dict[Pin, Path]:
    """Each pin's wheel in directory, or every missing and wrong wheel as problems."""
    where = str(directory)
    if not directory.is_dir():
        raise InputError(where, [Problem("--wheelhouse", f"{directory} is not a directory",
                                         "give the folder `narwhal install` built, or omit "
                                         "--wheelhouse to build one")])
    by_sha: dict[str, Path] = {}
    by_name: dict[tuple[str, str], list[Path]] = {}
    for wheel in sorted(directory.glob("*.whl")):
        if not wheel.is_file() or wheel.is_symlink():
            continue
        by_sha.setdefault(file_sha256(wheel), wheel)
        by_name.setdefault(_name_version(wheel), []).append(wheel)
    found: dict[Pin, Path] = {}
    problems = []
    for pin in lock.pins:
        if pin.sha256 in by_sha:
            found[pin] = by_sha[pin.sha256]
            continue
        same = by_name.get((pin.name, pin.version))
        if same:
            problems.append(Problem(f"--wheelhouse: {same[0].name}", f"sha256 "
                                    f"{file_sha256(same[0])} is not the locked {pin.sha256}",
                                    "remove it and rebuild the wheelhouse from runtime.lock"))
        else:
            problems.append(Problem(f"--wheelhouse: {pin.name}=={pin.version}",
                                    "no wheel for this pin",
                                    "rebuild the wheelhouse from runtime.lock (`narwhal install` "
                                    "without --wheelhouse, where a package index is reachable)"))
    if problems:
        raise InputError(where, problems)
    return found


def build(directory: Path, lock_path: Path, lock: Lock) -> dict[Pin, Path]:
    """Download every pin (hash-checked by pip itself) into directory, then verify it."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        return verify(directory, lock)  # warm: nothing to fetch
    except InputError:
        pass
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--only-binary=:all:", "--require-hashes", "--implementation", "cp",
            "--python-version", f"{lock.python_minor[0]}.{lock.python_minor[1]}",
            "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64",
            "-d", str(directory), "-r", str(lock_path)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired:
        done = subprocess.CompletedProcess(argv, 1, "", f"timed out after {BUILD_TIMEOUT_S} s")
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
        raise InputError(str(directory), [Problem(
            "wheelhouse", f"pip could not download the locked wheels: {tail}",
            "build it where a package index is reachable and pass --wheelhouse DIR")])
    return verify(directory, lock)
