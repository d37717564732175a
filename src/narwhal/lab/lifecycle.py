"""`lab up`, `lab down` and `lab status`: build the world, record it, remove exactly it.

`up` cleans up after itself if any step fails; `down` works from the state file and, for a
crashed run, from the lab's name prefix, so it is always safe to run again.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from narwhal.lab import boot, hostfs, labhub, network
from narwhal.lab.plan import DEFAULT_STATE_ROOT, LabPlan, make_plan
from narwhal.lab.run import LabError
from narwhal.lab.spec import LabSpec, validate
from narwhal.lab.state import HostState, LabState, alive

LOCK_FILE = DEFAULT_STATE_ROOT / ".lock"
# Refused for the lab directory: each host mounts its own copy of these.
FORBIDDEN_ROOTS = ("/tmp", "/root", "/home", "/srv", "/dev", "/proc", "/sys")  # noqa: S108


def default_state_path(name: str) -> Path:
    return DEFAULT_STATE_ROOT / name / "state.json"


@contextmanager
def locked() -> Iterator[None]:
    """One lab operation at a time on this machine."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    with open(LOCK_FILE, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _lab_dir(state_path: Path) -> Path:
    lab_dir = state_path.resolve().parent
    if state_path.name != "state.json":
        raise LabError(f"--state {state_path}: name the file state.json; its folder holds the lab")
    if any(str(lab_dir) == r or str(lab_dir).startswith(r + "/") for r in FORBIDDEN_ROOTS):
        raise LabError(f"--state {state_path}: lab files may not live under {', '.join(FORBIDDEN_ROOTS)} "
                       "(each host mounts its own copy of those); use a path under /run")
    return lab_dir


def plan_from_state(state: LabState) -> LabPlan:
    return make_plan(validate(state.spec, "lab state"), Path(state.dir))


def _write_client_files(plan: LabPlan) -> None:
    plan.known_hosts.write_text("".join(hostfs.host_key_line(h) + "\n" for h in plan.hosts))
    (plan.ws_dir / "cm").mkdir(exist_ok=True, mode=0o700)
    plan.ssh_config.write_text("\n".join([
        "Host *",
        f"  IdentityFile {plan.client_key}",
        "  IdentitiesOnly yes",
        f"  UserKnownHostsFile {plan.known_hosts}",
        "  GlobalKnownHostsFile /dev/null",
        "  StrictHostKeyChecking yes",
        "  BatchMode yes",
        "  ConnectTimeout 5",
        "  LogLevel ERROR",
        "",
    ]))


def boot_host(plan: LabPlan, state: LabState, name: str) -> None:
    """Start one host's init and wait until its sshd listens (also used by the boot fault)."""
    h = plan.host(name)
    proc, _outer = boot.start(plan, h)
    state.hosts[name] = HostState(netns=h.netns, init=proc)
    state.save(plan.state_file)
    boot.wait_listening(h, proc, time.monotonic() + boot.BOOT_TIMEOUT_S)


def up(spec: LabSpec, state_path: Path | None = None) -> LabPlan:
    """Build the lab; on any failure remove what was built and re-raise."""
    network.require_tools()
    state_path = state_path or default_state_path(spec.name)
    plan = make_plan(spec, _lab_dir(state_path))
    started = time.monotonic()
    with locked():
        if plan.state_file.exists() or network.list_netns(plan.prefix):
            raise LabError(f"lab {spec.name!r} is already up or was left by a crash; "
                           f"run `narwhal lab down --name {spec.name}` first")
        conflicts = network.root_conflicts(plan)
        if conflicts:
            raise LabError("a lab subnet is already reachable from the root namespace ("
                           + "; ".join(conflicts) + "); choose other subnets in the spec")
        plan.dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        state = LabState(name=spec.name, dir=str(plan.dir), spec=spec.model_dump(by_alias=True))
        state.save(plan.state_file)
        try:
            _build(plan, state)
        except BaseException:
            _teardown(plan.prefix, plan.state_file)
            raise
        state.up_seconds = round(time.monotonic() - started, 3)
        state.save(plan.state_file)
    return plan


def _build(plan: LabPlan, state: LabState) -> None:
    state.routes = network.add_guard_routes(plan)
    state.save(plan.state_file)
    leaks = [r for h in plan.hosts if (r := network.reachable_from_root(h.mgmt_ip))]
    if leaks:
        raise LabError("lab address still routable from the root namespace: " + "; ".join(leaks))
    state.netns = network.create_namespaces(plan)
    state.save(plan.state_file)
    network.wire(plan)
    hostfs.make_client_key(plan)
    hostfs.prepare_image(plan)
    for h in plan.hosts:
        hostfs.prepare_host(plan, h)
    if plan.spec.hub is not None:  # started before the hosts so that both boots overlap
        labhub.build_store(plan)
        state.hub = labhub.start(plan)
        state.save(plan.state_file)
    procs = []
    for h in plan.hosts:  # start every sshd first, then wait for all: boots overlap
        proc, _outer = boot.start(plan, h)
        procs.append((h.name, proc))
        state.hosts[h.name] = HostState(netns=h.netns, init=proc)
        state.save(plan.state_file)
    deadline = time.monotonic() + boot.BOOT_TIMEOUT_S
    for name, proc in procs:
        boot.wait_listening(plan.host(name), proc, deadline)
    if state.hub is not None:
        labhub.wait_ready(plan, state.hub, time.monotonic() + labhub.READY_TIMEOUT_S)
    _write_client_files(plan)


def _teardown(prefix: str, state_file: Path) -> list[str]:
    """Remove what the state lists plus anything carrying the lab's prefix; return a report."""
    report: list[str] = []
    state = LabState.read(state_file) if state_file.exists() else None
    if state is not None:
        for name, hs in state.hosts.items():
            if hs.init is not None and boot.stop(hs.init):
                report.append(f"stopped {name} (pid {hs.init.pid})")
        if state.hub is not None and labhub.stop(state.hub):
            report.append(f"stopped the lab hub (pid {state.hub.pid})")
    names = sorted(set(network.list_netns(prefix)) | set(state.netns if state else []))
    names = [n for n in names if n in network.list_netns(prefix)]
    for ns in names:
        _end_leftovers(ns, report)
    network.delete_namespaces(names)
    report += [f"deleted namespace {n}" for n in names]
    if state is not None:
        network.del_guard_routes(state.routes)
        report += [f"deleted guard route {r}" for r in state.routes]
        shutil.rmtree(state.dir, ignore_errors=True)
    return report


def _end_leftovers(netns: str, report: list[str]) -> None:
    """End processes still inside a lab namespace (sessions the lab's hosts started), by PID."""
    deadline = time.monotonic() + 2.0
    sent: set[int] = set()
    while time.monotonic() < deadline:
        pids = [p for p in network.netns_pids(netns) if p != os.getpid()]
        live = [p for p in pids if _running(p)]
        if not live:
            return
        for pid in live:
            if pid not in sent:
                os.kill(pid, 9)
                sent.add(pid)
                report.append(f"ended pid {pid} left in {netns}")
        time.sleep(0.02)
    raise LabError(f"processes in {netns} did not end: {network.netns_pids(netns)}")


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def down(name: str, state_path: Path | None = None) -> list[str]:
    state_path = state_path or default_state_path(name)
    with locked():
        return _teardown(name + "-", state_path)


def status(state_path: Path) -> dict[str, object]:
    if not state_path.exists():
        return {"up": False}
    state = LabState.read(state_path)
    plan = plan_from_state(state)
    hosts = {}
    for h in plan.hosts:
        hs = state.hosts.get(h.name)
        running = bool(hs and hs.init and alive(hs.init))
        hosts[h.name] = {"role": h.host.role, "netns": h.netns, "mgmt_ip": h.mgmt_ip,
                         "fabric_ip": h.fabric_ip, "running": running}
    report: dict[str, object] = {
        "up": True, "name": state.name, "dir": state.dir, "up_seconds": state.up_seconds,
        "workstation": {"netns": plan.ws_netns, "mgmt_ip": plan.ws_ip},
        "hosts": hosts, "faults": state.faults}
    access = labhub.hub_access(plan)
    if access is not None:
        report["hub"] = {"netns": plan.hub_netns, "mgmt_ip": plan.hub_ip,
                         "endpoint": access.endpoint, "repo_id": access.repo_id,
                         "token_file": str(access.token_path) if access.token_path else None,
                         "running": bool(state.hub and alive(state.hub))}
    return report
