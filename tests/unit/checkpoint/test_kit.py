"""The stage kit is the hub client's locked closure, judged for the hosts' platform."""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from pathlib import Path

import pytest

from narwhal.deploy.checkpoint.kit import Kit, closure
from narwhal.node import stage_checkpoint

LOCKED = {"huggingface-hub", "httpx2", "anyio", "idna", "tqdm", "colorama", "tomli", "hf-xet",
          "filelock"}
REQUIRES = {
    "huggingface-hub": ["filelock>=3", "httpx2<3,>=2.0.0", "tqdm>=4.42.1",
                        'tomli>=1.1.0; python_version < "3.11"',
                        'hf-xet<2,>=1.6; platform_machine == "x86_64"',
                        'pytest; extra == "testing"'],
    "httpx2": ["anyio>=4.10; sys_platform != 'emscripten'", "idna>=3.18"],
    "anyio": ["idna>=2.8"], "idna": [], "filelock": [], "hf-xet": [],
    "tqdm": ['colorama; platform_system == "Windows"'],
}
LINUX_311 = {"python_version": "3.11", "platform_machine": "x86_64", "sys_platform": "linux",
             "platform_system": "Linux", "extra": ""}


def test_the_closure_follows_requirements_whose_markers_hold_on_the_hosts() -> None:
    got = closure(lambda n: REQUIRES[n], "huggingface_hub", LINUX_311, LOCKED)
    assert got[0] == "huggingface-hub"
    assert set(got) == {"huggingface-hub", "filelock", "httpx2", "tqdm", "hf-xet", "anyio",
                        "idna"}


def test_a_needed_package_missing_from_the_lock_is_named() -> None:
    with pytest.raises(ValueError, match="anyio"):
        closure(lambda n: REQUIRES[n], "huggingface_hub", LINUX_311, LOCKED - {"anyio"})


def _wheel(folder: Path, name: str, module: str) -> tuple[str, Path, str]:
    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{module}/__init__.py", f"NAME = {module!r}\n")
        z.writestr(f"{name}-1.0.dist-info/METADATA", f"Name: {name}\nVersion: 1.0\n")
    return path.name, path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_kit_travels_as_one_archive_and_unpacks_only_wheels_with_their_locked_hash(
        tmp_path: Path) -> None:
    kit = Kit((_wheel(tmp_path, "alpha", "alpha"), _wheel(tmp_path, "beta", "beta")))
    archive = kit.archive(tmp_path / "builds")
    assert archive.read_bytes() == Kit(kit.wheels).archive(tmp_path / "again").read_bytes()
    host = tmp_path / "host-kit"
    host.mkdir()
    shutil.copy(archive, host / "kit.zip")
    wheels = [{"file": n, "sha256": s} for n, _, s in kit.wheels]
    tampered = [{**wheels[0], "sha256": "0" * 64}, wheels[1]]
    with pytest.raises(ValueError, match="alpha"):
        stage_checkpoint.unpack_kit(str(host), tampered, "kit.zip")
    assert not (host / "site").exists(), "nothing unpacked from a kit that failed its check"
    assert stage_checkpoint.unpack_kit(str(host), wheels, "kit.zip") is True
    assert (host / "site" / "beta" / "__init__.py").read_text() == "NAME = 'beta'\n"
    assert stage_checkpoint.unpack_kit(str(host), wheels, "kit.zip") is False  # once per kit
