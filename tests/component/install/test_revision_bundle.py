"""The revision's bundle is the same bytes however the workstation's clone is packed.

Every host keeps one `revision.bundle` per revision and refuses a different file at that
path, so a second workstation (or a fresh runs folder) that bundles the same revision must
produce exactly what the first sent. Real git, real repositories.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from narwhal.deploy.package import source


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True,
                          text=True, timeout=120).stdout.strip()


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, str]:
    """A repository whose files change a little in every commit, so packing finds deltas."""
    repo = tmp_path / "origin"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "t@example.invalid")
    _git(repo, "config", "user.name", "t")
    lines = [f"line {i}: {'x' * (i % 37)} {i * 7919 % 1000}\n" for i in range(3000)]
    for commit in range(12):
        for name in ("a.txt", "b.txt", "c.txt"):
            lines[commit * 97 % len(lines)] = f"changed in {commit} {name}\n"
            (repo / name).write_text("".join(lines) + name * commit)
        _git(repo, "add", ".")
        _git(repo, "commit", "-q", "-m", f"c{commit}")
    return repo, _git(repo, "rev-parse", "HEAD")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_two_differently_packed_clones_bundle_the_same_revision_to_the_same_bytes(
        history: tuple[Path, str], tmp_path: Path) -> None:
    origin, revision = history  # loose objects, never packed
    packed = tmp_path / "packed"
    subprocess.run(["git", "clone", "-q", "--no-local", str(origin), str(packed)], check=True,
                   timeout=120)
    _git(packed, "gc", "-q", "--aggressive")
    source.make_bundle(origin, revision, tmp_path / "one.bundle")
    source.make_bundle(packed, revision, tmp_path / "two.bundle")
    assert _sha(tmp_path / "one.bundle") == _sha(tmp_path / "two.bundle")
    clone = tmp_path / "from-bundle"
    subprocess.run(["git", "clone", "-q", "--branch", source.BRANCH,
                    str(tmp_path / "two.bundle"), str(clone)], check=True, timeout=120)
    assert _git(clone, "rev-parse", "HEAD") == revision


def test_a_revision_the_checkout_lacks_is_named_and_writes_nothing(
        history: tuple[Path, str], tmp_path: Path) -> None:
    origin, _ = history
    missing = "0" * 40
    with pytest.raises(source.InputError) as raised:
        source.make_bundle(origin, missing, tmp_path / "none.bundle")
    assert "git fetch" in str(raised.value.problems[0].field)
    assert not (tmp_path / "none.bundle").exists()
