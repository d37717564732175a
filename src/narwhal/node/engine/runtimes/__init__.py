"""The engine runtimes, one module each (docker, podman, native), chosen here and nowhere else.

`choose` picks the runtime a plan or a started.json names. `container_for` picks the container
runtime that builds a container's argv from the launch record's own runtime (its binary and GPU
flags), which is how the plan has always been built, also under `prepare --runtime`.
"""

from __future__ import annotations

from narwhal.node.engine.errors import RuntimeError_
from narwhal.node.engine.runtimes import docker, native, podman
from narwhal.node.engine.runtimes.base import Runtime, Started
from narwhal.node.engine.runtimes.container import ContainerRuntime

RUNTIMES: dict[str, Runtime] = {r.name: r for r in (docker.RUNTIME, podman.RUNTIME,
                                                     native.RUNTIME)}
NAMES = tuple(RUNTIMES)  # ("docker", "podman", "native"): `prepare --runtime`'s choices

__all__ = ["NAMES", "RUNTIMES", "Runtime", "Started", "choose", "container_for"]


def choose(name: str) -> Runtime:
    """The runtime called `name`; refused, listing the known ones, for any other name."""
    try:
        return RUNTIMES[name]
    except KeyError:
        raise RuntimeError_(f"unknown engine runtime {name!r}: one of "
                            f"{', '.join(NAMES)}") from None


def container_for(record_runtime: str) -> ContainerRuntime:
    """The container runtime whose flags a container's argv takes: podman's for a podman
    record, docker's for any other (as the plan has always been built)."""
    return podman.RUNTIME if record_runtime == "podman" else docker.RUNTIME
