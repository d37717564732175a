"""Namespaces, bridges, veths and the root namespace's guard routes.

The bridges sit in a switch namespace, not in the root namespace, so lab traffic never crosses
the root namespace's firewall and the root namespace holds no lab link. The root namespace gets
only `unreachable` routes for the lab subnets: a stray packet fails here with "No route to host"
instead of following the default route off the machine.
"""

from __future__ import annotations

import ipaddress
import json

from narwhal.lab.plan import LabPlan
from narwhal.lab.run import LabError, run
from narwhal.lab.spec import subnet

MGMT_BRIDGE = "br-mgmt"
FABRIC_BRIDGE = "br-fab"
MGMT_IF = "mgmt0"
FABRIC_IF = "fab0"


def _batch(lines: list[str], netns: str | None = None) -> None:
    argv = ["ip", "-force", "-batch", "-"]
    if netns:
        argv[1:1] = ["-n", netns]
    run(argv, input_text="\n".join(lines) + "\n")


def lab_subnets(plan: LabPlan) -> list[ipaddress.IPv4Network]:
    return [subnet(plan.spec, "management"), subnet(plan.spec, "fabric")]


def root_conflicts(plan: LabPlan) -> list[str]:
    """Routes or addresses in the root namespace that already cover a lab subnet."""
    found: list[str] = []
    nets = lab_subnets(plan)
    routes = json.loads(run(["ip", "-j", "route", "show", "table", "all"]).stdout or "[]")
    for r in routes:
        dst = r.get("dst", "")
        if dst in ("default", "") or r.get("type") in ("unreachable", "local", "broadcast"):
            continue
        try:
            net = ipaddress.ip_network(dst if "/" in dst else dst + "/32", strict=False)
        except ValueError:
            continue
        if any(net.version == n.version and net.overlaps(n) for n in nets):
            found.append(f"route {dst} dev {r.get('dev', '?')}")
    for link in json.loads(run(["ip", "-j", "addr"]).stdout or "[]"):
        for a in link.get("addr_info", []):
            if a.get("family") != "inet":
                continue
            addr = ipaddress.ip_address(a["local"])
            if any(addr in n for n in nets):
                found.append(f"address {a['local']} on {link.get('ifname')}")
    return found


def reachable_from_root(ip: str) -> str | None:
    """The route the root namespace would use for ip, or None when it has none (unreachable)."""
    done = run(["ip", "-j", "route", "get", ip], check=False)
    if done.returncode != 0:
        return None
    routes = json.loads(done.stdout or "[]")
    if not routes or routes[0].get("type") == "unreachable":
        return None
    r = routes[0]
    return f"{ip} via {r.get('gateway', 'link')} dev {r.get('dev', '?')}"


def add_guard_routes(plan: LabPlan) -> list[str]:
    nets = [str(n) for n in lab_subnets(plan)]
    for net in nets:
        run(["ip", "route", "replace", "unreachable", net])
    return nets


def del_guard_routes(nets: list[str]) -> None:
    for net in nets:
        shown = run(["ip", "-j", "route", "show", "type", "unreachable", net], check=False)
        if shown.returncode == 0 and json.loads(shown.stdout or "[]"):
            run(["ip", "route", "del", "unreachable", net], check=False)


def create_namespaces(plan: LabPlan) -> list[str]:
    names = [plan.sw_netns, plan.ws_netns, *(h.netns for h in plan.hosts)]
    names += [plan.hub_netns] if plan.spec.hub is not None else []
    _batch([f"netns add {n}" for n in names])
    return names


def wire(plan: LabPlan) -> None:
    """Bridges in the switch namespace; one veth pair per host per network."""
    mtu_m, mtu_f = plan.spec.management.mtu, plan.spec.fabric.mtu
    sw = [
        f"link add {MGMT_BRIDGE} mtu {mtu_m} type bridge",
        f"link add {FABRIC_BRIDGE} mtu {mtu_f} type bridge",
        "link set lo up",
        f"link set {MGMT_BRIDGE} up",
        f"link set {FABRIC_BRIDGE} up",
        f"link add ws-m mtu {mtu_m} type veth peer name {MGMT_IF} netns {plan.ws_netns}",
        f"link set ws-m master {MGMT_BRIDGE} up",
    ]
    for h in plan.hosts:
        sw += [
            f"link add {h.name}-m mtu {mtu_m} type veth peer name {MGMT_IF} netns {h.netns}",
            f"link set {h.name}-m master {MGMT_BRIDGE} up",
            f"link add {h.name}-f mtu {mtu_f} type veth peer name {FABRIC_IF} netns {h.netns}",
            f"link set {h.name}-f master {FABRIC_BRIDGE} up",
        ]
    _batch(sw, plan.sw_netns)
    _batch(["link set lo up", f"addr add {plan.ws_ip}/{plan.mgmt_prefix} dev {MGMT_IF}",
            f"link set {MGMT_IF} up"], plan.ws_netns)
    for h in plan.hosts:
        _batch([
            "link set lo up",
            f"addr add {h.mgmt_ip}/{plan.mgmt_prefix} dev {MGMT_IF}",
            f"link set {MGMT_IF} mtu {mtu_m} up",
            f"addr add {h.fabric_ip}/{plan.fabric_prefix} dev {FABRIC_IF}",
            f"link set {FABRIC_IF} mtu {mtu_f} up",
            *([] if h.host.hub_route or plan.spec.hub is None else [hub_route_line(plan, "add")]),
        ], h.netns)
    if plan.spec.hub is not None:
        _batch(hub_switch_lines(plan), plan.sw_netns)
        _batch(hub_lines(plan), plan.hub_netns)


def hub_switch_lines(plan: LabPlan) -> list[str]:
    """The hub's port on the management bridge (it has no fabric link: checkpoints are
    staged over the management network, as from the internet)."""
    return [f"link add hub-m mtu {plan.spec.management.mtu} type veth peer name {MGMT_IF} "
            f"netns {plan.hub_netns}", f"link set hub-m master {MGMT_BRIDGE} up"]


def hub_lines(plan: LabPlan) -> list[str]:
    return ["link set lo up", f"addr add {plan.hub_ip}/{plan.mgmt_prefix} dev {MGMT_IF}",
            f"link set {MGMT_IF} up"]


def hub_route_line(plan: LabPlan, verb: str) -> str:
    """An `ip -batch` line adding or deleting a host's unreachable route to the hub: the
    host's connections to it fail at once with "No route to host"."""
    return f"route {verb} unreachable {plan.hub_ip}/32"


def set_hub_route(plan: LabPlan, netns: str, *, reachable: bool, check: bool = True) -> None:
    """Give a host its route to the hub back, or take it away (the hub-cut fault)."""
    verb = "del" if reachable else "add"
    run(["ip", "-n", netns, "route", verb, "unreachable", f"{plan.hub_ip}/32"], check=check)


def list_netns(prefix: str) -> list[str]:
    out = run(["ip", "-j", "netns", "list"], check=False).stdout
    names = [n["name"] for n in json.loads(out or "[]")]
    return [n for n in names if n.startswith(prefix)]


def netns_pids(netns: str) -> list[int]:
    done = run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def delete_namespaces(names: list[str]) -> None:
    if names:
        _batch([f"netns del {n}" for n in names])


def require_tools() -> None:
    """Fail early, naming the missing tool, rather than half-way through `up`."""
    done = run(["ip", "netns", "list"], check=False)
    if done.returncode != 0:
        raise LabError(f"`ip netns` is unavailable: {done.stderr.strip()}")
