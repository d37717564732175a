"""The stage kit is the hub client's locked closure, judged for the hosts' platform."""

from __future__ import annotations

import pytest

from narwhal.deploy.checkpoint.kit import closure

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
