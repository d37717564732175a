"""Containers on a host, known by id and creation time so a recreated one is never ours.

Container ids are random, yet a restored checkpoint (`podman container restore`) or a
rebuilt runtime state can bring an id back on a different container. The creation time tells
them apart: a gate records both when it creates a container, and recovery removes it only
while both still match.
"""

from __future__ import annotations

from dataclasses import dataclass

from narwhal.core.errors import HostError
from narwhal.deploy.hosts import commandline as cl
from narwhal.deploy.hosts.base import Host, RunResult


@dataclass(frozen=True)
class ContainerIdentity:
    runtime: str
    id: str
    created: str


def _gone(result: RunResult) -> bool:
    """The runtime's own "no such container" answer (docker: "No such container",
    podman: "no such container")."""
    return not result.ok and b"no such" in (result.stderr + result.stdout).lower()


def inspect_container(host: Host, runtime: str, container_id: str) -> ContainerIdentity | None:
    """The container's identity now, or None when the runtime knows no such container."""
    result = host.run(cl.container_identity(runtime, container_id))
    if _gone(result):
        return None
    result.check()
    try:
        found_id, created = cl.parse_container_identity(result.text)
    except ValueError as exc:
        raise HostError(host.alias, f"`{runtime} inspect` answered unexpectedly: {exc}",
                        command=runtime) from None
    return ContainerIdentity(runtime, found_id, created)


def remove_container(host: Host, runtime: str, container_id: str) -> bool:
    """Force-remove the container; False when it was already gone."""
    result = host.run(cl.container_remove(runtime, container_id))
    if _gone(result):
        return False
    result.check()
    return True
