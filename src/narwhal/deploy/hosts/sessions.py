"""Physical hosts of a deployment: roles that share an SSH destination share one session."""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from narwhal.core.secret import Secret
from narwhal.deploy.hosts.base import Host
from narwhal.deploy.hosts.local import LocalHost
from narwhal.deploy.hosts.ssh import SshHost
from narwhal.deploy.inputs.destination import Destination
from narwhal.deploy.inputs.model import Inputs


@dataclass
class PhysicalHost:
    alias: str
    destination: Destination
    roles: list[str] = field(default_factory=list)
    key: str | None = None
    password: Secret | None = None


def physical_hosts(inputs: Inputs) -> list[PhysicalHost]:
    """Engines first (node-<n> of the first role), then a router-only host (`router`).

    One per login: two users of one machine get two sessions. Which sessions reach one
    machine (for GPU sharing and start order) is measured by Gate A, see core/gpu_sharing."""
    hosts: dict[tuple[str, str, int], PhysicalHost] = {}  # one session per login, however written
    for engine in inputs.engines:
        host = hosts.setdefault(engine.ssh.identity, PhysicalHost(
            f"node-{engine.n}", engine.ssh, key=engine.ssh_key or inputs.ssh_key,
            password=engine.ssh_password))
        host.roles.append(engine.role)
    router = inputs.router
    host = hosts.setdefault(router.ssh.identity, PhysicalHost(
        "router", router.ssh, key=router.ssh_key or inputs.ssh_key, password=router.ssh_password))
    host.roles.append("router")
    return list(hosts.values())


def known_hosts_path(inputs: Inputs, runs: Path) -> Path:
    return Path(inputs.known_hosts) if inputs.known_hosts else runs / inputs.deployment / \
        "known_hosts"


def control_dir(runs: Path, deployment: str) -> Path:
    """A short private directory for ControlMaster sockets (unix paths max out at 108 bytes)."""
    tag = hashlib.sha256(str((runs / deployment).resolve()).encode()).hexdigest()[:10]
    path = Path(tempfile.gettempdir()) / f"nw-{tag}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


class Sessions:
    """Opens one session per physical host on demand and closes them all at the end."""

    def __init__(self, inputs: Inputs, runs: Path, ssh_config: str | None = None) -> None:
        self.inputs = inputs
        self.hosts = {h.alias: h for h in physical_hosts(inputs)}
        self.known_hosts = known_hosts_path(inputs, runs)
        self.control = control_dir(runs, inputs.deployment)
        self.ssh_config = ssh_config
        self._open: dict[str, Host] = {"workstation": LocalHost()}

    def get(self, alias: str) -> Host:
        if alias not in self._open:
            spec = self.hosts[alias]
            self._open[alias] = SshHost(
                alias, spec.destination, known_hosts=self.known_hosts, control_dir=self.control,
                key=spec.key, password=spec.password,
                connect_timeout=self.inputs.connect_timeout_s, ssh_config=self.ssh_config)
        return self._open[alias]

    def roles(self) -> dict[str, list[str]]:
        return {alias: list(h.roles) for alias, h in self.hosts.items()}

    def close(self) -> None:
        for host in self._open.values():
            host.close()
