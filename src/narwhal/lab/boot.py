"""Power a host on and off: its sshd as PID 1 of a private PID, mount and UTS namespace.

Killing that PID is a power cut: the kernel ends every process of the host at once. The outer
`unshare` ignores SIGTERM, so the state records the inner PID (the host's init) with its start
time, and only that exact process is ever signalled.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

from narwhal.lab.plan import DOUBLES_MOUNT, HostPlan, LabPlan
from narwhal.lab.run import LabError
from narwhal.lab.state import Proc, alive, start_ticks

BOOT_TIMEOUT_S = 8.0
ESSENTIAL_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


def _mount_script(plan: LabPlan, h: HostPlan) -> str:
    """Shell run inside the host's fresh mount namespace before it execs sshd."""
    d = str(h.dir)
    q = shlex.quote
    run_dir = plan.spec.run_dir
    lines = ["set -e", f"hostname {q(h.netns)}"]
    for name in ("passwd", "shadow", "group", "hostname"):
        lines.append(f"mount --bind {q(d + '/etc/' + name)} /etc/{name}")
    for sub in ("root", "home", "srv"):
        lines.append(f"mount --bind {q(d + '/' + sub)} /{sub}")
    lines += [
        # The host's disk directory is a small tmpfs, so `fill` gives a real ENOSPC.
        f"mount -t tmpfs -o size={h.host.disk_mib}m,mode=755 lab-disk {q(run_dir)}",
        f"mount --bind {q(d + '/bin')} {DOUBLES_MOUNT}",
        f"if [ -d /sys/bus/pci/devices ]; then mount --bind {q(d + '/pci')} /sys/bus/pci/devices; fi",
        # A private /dev: the essentials bound from the machine, plus the inventory's device files.
        f"mount --rbind /dev {q(d + '/realdev')}",
        "mount -t tmpfs -o mode=755,size=1m lab-dev /dev",
    ]
    for name in ESSENTIAL_DEVICES:
        lines.append(f": > /dev/{name}; mount --bind {q(d + '/realdev/' + name)} /dev/{name}")
    lines += [
        f"mkdir /dev/pts /dev/shm; mount --bind {q(d + '/realdev/pts')} /dev/pts",
        "ln -s pts/ptmx /dev/ptmx; ln -s /proc/self/fd /dev/fd",
        "ln -s /proc/self/fd/0 /dev/stdin; ln -s /proc/self/fd/1 /dev/stdout; "
        "ln -s /proc/self/fd/2 /dev/stderr",
        "mount -t tmpfs -o mode=1777 lab-shm /dev/shm",
        f"cp -a {q(d + '/dev')}/. /dev/",
        f"umount -l {q(d + '/realdev')}",
        f"mount --rbind {q(d + '/tmp')} /tmp",  # noqa: S108 - the host's private /tmp
    ]
    if h.host.cpus is not None:
        # Its own cores: a NUMA view listing only them (vLLM's CPU NIXL worker moves the
        # model thread to each node's last core), and every process confined to them.
        lines += [f"mount --bind {q(d + '/sysnode')} /sys/devices/system/node",
                  f"taskset -p -c {','.join(map(str, h.host.cpus))} $$ >/dev/null"]
    lines += [
        f"exec /usr/sbin/sshd -D -f {q(d + '/sshd/sshd_config')} -E {q(d + '/sshd/sshd.log')}",
    ]
    return "\n".join(lines)


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _listening(pid: int, ip: str, port: int) -> bool:
    """Whether the process's network namespace has a TCP listener on ip:port (no subprocess)."""
    want = "".join(f"{int(o):02X}" for o in reversed(ip.split("."))) + f":{port:04X}"
    try:
        table = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(line.split()[1] == want and line.split()[3] == "0A" for line in table)


def start(plan: LabPlan, h: HostPlan) -> tuple[Proc, subprocess.Popen[bytes]]:
    """Start the host's init (sshd); return its recorded process and the outer unshare."""
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd refuses to start without it
    argv = ["ip", "netns", "exec", h.netns, "unshare", "--uts", "--mount", "--propagation", "slave",
            "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", _mount_script(plan, h)]
    log = open(h.dir / "boot.log", "wb")  # noqa: SIM115 - handed to the child
    outer = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             start_new_session=True, close_fds=True)
    log.close()
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while time.monotonic() < deadline:
        kids = _children(outer.pid)
        if kids:
            ticks = start_ticks(kids[0])
            if ticks is not None:
                return Proc(pid=kids[0], start_ticks=ticks, what=f"{h.name} init (sshd)"), outer
        if outer.poll() is not None:
            break
        time.sleep(0.005)
    raise LabError(f"host {h.name} did not boot: {(h.dir / 'boot.log').read_text()[-600:]}")


def wait_listening(h: HostPlan, proc: Proc, deadline: float) -> None:
    while time.monotonic() < deadline:
        if _listening(proc.pid, h.mgmt_ip, 22):
            return
        if not alive(proc):
            break
        time.sleep(0.01)
    log = (h.dir / "boot.log").read_text()[-400:] + (h.dir / "sshd" / "sshd.log").read_text()[-400:] \
        if (h.dir / "sshd" / "sshd.log").exists() else (h.dir / "boot.log").read_text()[-600:]
    raise LabError(f"host {h.name}: sshd is not listening on {h.mgmt_ip}:22: {log}")


def stop(proc: Proc, timeout: float = 3.0) -> bool:
    """SIGKILL exactly this process if it is still the one we started; wait until it is gone."""
    if not alive(proc):
        return False
    os.kill(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while alive(proc) and time.monotonic() < deadline:
        time.sleep(0.005)
    return True
