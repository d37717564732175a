"""Names and addresses of one lab, derived once from the spec and the lab directory.

Every namespace is named `<lab>-<host>`, so a crashed run can be found again by that prefix;
the bridges live in their own switch namespace `<lab>-sw`, so the root namespace gets no lab
link at all, only the two unreachable guard routes.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from narwhal.lab.spec import Host, LabSpec, subnet

DEFAULT_STATE_ROOT = Path("/run/narwhal-lab")
HOST_OFFSET = 10  # host i gets network address + 10 + i, as in the recipe
WORKSTATION_OFFSET = 2
HUB_OFFSET = 5  # the lab hub's management address (when the spec has a hub)
# First on root's and users' PATH inside a host; empty on Debian, so binding over it hides nothing.
DOUBLES_MOUNT = "/usr/local/sbin"
SESSION_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class HostPlan:
    host: Host
    index: int
    netns: str
    mgmt_ip: str
    fabric_ip: str
    dir: Path

    @property
    def name(self) -> str:
        return self.host.name


@dataclass(frozen=True)
class LabPlan:
    spec: LabSpec
    dir: Path
    hosts: tuple[HostPlan, ...]
    ws_netns: str
    sw_netns: str
    ws_ip: str
    mgmt_prefix: int
    fabric_prefix: int
    hub_netns: str
    hub_ip: str

    @property
    def prefix(self) -> str:
        return self.spec.name + "-"

    @property
    def ws_dir(self) -> Path:
        return self.dir / "ws"

    @property
    def client_key(self) -> Path:
        return self.ws_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ws_dir / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.ws_dir / "ssh_config"

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    @property
    def hub_dir(self) -> Path:
        return self.dir / "hub"

    def host(self, name: str) -> HostPlan:
        for h in self.hosts:
            if h.name == name:
                return h
        known = ", ".join(h.name for h in self.hosts)
        raise KeyError(f"no lab host {name!r}; hosts are: {known}")

    def engines(self) -> list[HostPlan]:
        return [h for h in self.hosts if h.host.role == "engine"]

    def router(self) -> HostPlan:
        return next(h for h in self.hosts if h.host.role == "router")


def _nth(net: ipaddress.IPv4Network, offset: int) -> str:
    return str(net.network_address + offset)


def make_plan(spec: LabSpec, lab_dir: Path) -> LabPlan:
    mgmt, fab = subnet(spec, "management"), subnet(spec, "fabric")
    hosts = tuple(
        HostPlan(
            host=h,
            index=i,
            netns=f"{spec.name}-{h.name}",
            mgmt_ip=_nth(mgmt, HOST_OFFSET + i),
            fabric_ip=_nth(fab, HOST_OFFSET + i),
            dir=lab_dir / "hosts" / h.name,
        )
        for i, h in enumerate(spec.hosts)
    )
    return LabPlan(
        spec=spec,
        dir=lab_dir,
        hosts=hosts,
        ws_netns=f"{spec.name}-ws",
        sw_netns=f"{spec.name}-sw",
        ws_ip=_nth(mgmt, WORKSTATION_OFFSET),
        mgmt_prefix=mgmt.prefixlen,
        fabric_prefix=fab.prefixlen,
        hub_netns=f"{spec.name}-hub",
        hub_ip=_nth(mgmt, HUB_OFFSET),
    )
