"""Faults a rehearsal needs, each recorded in the state file so `lab fault clear` undoes it.

Network faults live only inside the affected host's namespace (tc on its fabric egress, one nft
table per fault), so undoing one never disturbs another and nothing touches the root namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

from narwhal.lab import boot, hostfs, identity
from narwhal.lab.lifecycle import boot_host, locked, plan_from_state
from narwhal.lab.network import FABRIC_IF, set_hub_route
from narwhal.lab.plan import SESSION_PATH, LabPlan
from narwhal.lab.run import LabError, in_netns, run
from narwhal.lab.state import LabState, alive

FILL_NAME = ".lab-fill"


def _table(fault_id: int, hook: str, rule: str) -> str:
    """One nft table per fault, so deleting the table undoes exactly that fault."""
    return "\n".join([f"table inet nwlab_{fault_id} {{", "  chain c {",
                      f"    type filter hook {hook} priority 0; policy accept;", f"    {rule}",
                      "  }", "}", ""])


class Faults:
    """Apply and undo faults on one running lab; every change is saved to its state file."""

    def __init__(self, state_path: Path) -> None:
        self.state_path = state_path
        self.state = LabState.read(state_path)
        self.plan: LabPlan = plan_from_state(self.state)

    def _next_id(self) -> int:
        return max((f["id"] for f in self.state.faults), default=0) + 1

    def _record(self, fault: dict[str, Any]) -> dict[str, Any]:
        fault.setdefault("id", self._next_id())
        self.state.faults.append(fault)
        self.state.save(self.state_path)
        return fault

    def _tc(self, host: str, *args: str, check: bool = True) -> None:
        run(in_netns(self.plan.host(host).netns, ["tc", *args]), check=check)

    def _nft(self, host: str, script: str) -> None:
        run(in_netns(self.plan.host(host).netns, ["nft", "-f", "-"]), input_text=script)

    # network ---------------------------------------------------------------
    def _apply_shapes(self, src: str) -> None:
        self._tc(src, "qdisc", "del", "dev", FABRIC_IF, "root", check=False)
        shapes = [f for f in self.state.faults if f["kind"] == "shape" and f["src"] == src]
        if not shapes:
            return
        self._tc(src, "qdisc", "add", "dev", FABRIC_IF, "root", "handle", "1:", "htb")
        for f in shapes:
            dst = self.plan.host(f["dst"])
            classid = f"1:{10 + dst.index}"
            self._tc(src, "class", "add", "dev", FABRIC_IF, "parent", "1:", "classid", classid,
                     "htb", "rate", f["rate"], "ceil", f["rate"])
            self._tc(src, "filter", "add", "dev", FABRIC_IF, "parent", "1:", "protocol", "ip", "prio",
                     "1", "u32", "match", "ip", "dst", f"{dst.fabric_ip}/32", "flowid", classid)

    def shape(self, src: str, dst: str, rate: str) -> dict[str, Any]:
        """Cap the directed fabric edge src -> dst (htb + u32 on src's egress); reverse untouched."""
        self.plan.host(dst)
        self.state.faults = [f for f in self.state.faults
                             if not (f["kind"] == "shape" and (f["src"], f["dst"]) == (src, dst))]
        fault = self._record({"kind": "shape", "src": src, "dst": dst, "rate": rate})
        self._apply_shapes(src)
        return fault

    def loss(self, src: str, dst: str, percent: int) -> dict[str, Any]:
        if not 0 < percent <= 100:
            raise LabError(f"loss percent {percent} out of range; give 1..100")
        # Dropped as they arrive at dst (its input hook), as a lossy wire drops them: a drop in
        # src's own output path is reported to the sender's TCP as a local error and resent
        # without being counted as a retransmission, which no real link does.
        fid, ip = self._next_id(), self.plan.host(src).fabric_ip
        self._nft(dst, _table(fid, "input", f"ip saddr {ip} numgen random mod 100 < {percent} drop"))
        return self._record({"id": fid, "kind": "loss", "src": src, "dst": dst, "percent": percent})

    def block(self, host: str, port: int, mode: str = "reject", proto: str = "tcp") -> dict[str, Any]:
        if mode not in ("reject", "drop") or proto not in ("tcp", "udp"):
            raise LabError("block mode is reject or drop; proto is tcp or udp")
        fid = self._next_id()
        verdict = "reject with tcp reset" if mode == "reject" and proto == "tcp" else mode
        self._nft(host, _table(fid, "input", f"{proto} dport {port} {verdict}"))
        return self._record({"id": fid, "kind": "block", "host": host, "port": port, "mode": mode,
                             "proto": proto})

    def isolate(self, host: str) -> dict[str, Any]:
        """Cut a host from every network (management and fabric, both ways) while its
        processes run on: a partition, not a crash. Only its loopback still works."""
        self.plan.host(host)
        fid = self._next_id()
        chains = "".join(f"  chain {hook} {{\n    type filter hook {hook} priority -10; "
                         f"policy drop;\n    {'iif' if hook == 'input' else 'oif'} \"lo\" "
                         "accept\n  }\n" for hook in ("input", "output"))
        self._nft(host, f"table inet nwlab_{fid} {{\n{chains}}}\n")
        return self._record({"id": fid, "kind": "isolate", "host": host})

    def mtu(self, host: str, mtu: int) -> dict[str, Any]:
        """Set the MTU of one host's fabric interface (only that end of its links changes)."""
        if not 576 <= mtu <= 9000:
            raise LabError(f"MTU {mtu} out of range; give 576..9000")
        netns = self.plan.host(host).netns
        before = json.loads(run(in_netns(netns, ["ip", "-j", "link", "show", "dev", FABRIC_IF])
                                ).stdout)[0]["mtu"]
        run(in_netns(netns, ["ip", "link", "set", "dev", FABRIC_IF, "mtu", str(mtu)]))
        return self._record({"kind": "mtu", "host": host, "mtu": mtu, "before": before})

    def hub_cut(self, host: str) -> dict[str, Any]:
        """Take away a host's route to the lab hub (an unreachable route in its namespace):
        staging from the hub fails there with "No route to host"; every host still answers."""
        h = self.plan.host(host)
        if self.plan.spec.hub is None:
            raise LabError(f"lab {self.plan.spec.name} has no hub to cut a host from")
        if not h.host.hub_route or any(f["kind"] == "hub-cut" and f["host"] == host
                                       for f in self.state.faults):
            raise LabError(f"host {host} already has no route to the hub")
        set_hub_route(self.plan, h.netns, reachable=False)
        return self._record({"kind": "hub-cut", "host": host})

    # hosts -----------------------------------------------------------------
    def _init(self, host: str) -> Any:
        hs = self.state.hosts.get(host)
        if hs is None or hs.init is None or not alive(hs.init):
            raise LabError(f"host {host} is not running; `narwhal lab fault boot {host}` first")
        return hs.init

    def crash(self, host: str) -> dict[str, Any]:
        """Power cut: SIGKILL the host's init, so every process on it dies at once."""
        boot.stop(self._init(host))
        self.state.hosts[host].crashed = True
        return self._record({"kind": "crash", "host": host})

    def boot(self, host: str) -> None:
        hs = self.state.hosts.get(host)
        if hs is not None and hs.init is not None and alive(hs.init):
            raise LabError(f"host {host} is already running")
        boot_host(self.plan, self.state, host)
        self.state.faults = [f for f in self.state.faults if not (f["kind"] == "crash" and f["host"] == host)]
        self.state.save(self.state_path)

    def _restart(self, host: str) -> None:
        hs = self.state.hosts.get(host)
        if hs is not None and hs.init is not None:
            boot.stop(hs.init)
        boot_host(self.plan, self.state, host)

    def rekey(self, host: str) -> dict[str, Any]:
        """Give the host a new sshd host key (the old one is kept to restore) and restart sshd."""
        h = self.plan.host(host)
        key = h.dir / "sshd" / "ssh_host_ed25519_key"
        for suffix in ("", ".pub"):
            orig = Path(f"{key}{suffix}.orig")
            if not orig.exists():
                shutil.copy2(f"{key}{suffix}", orig)
        hostfs.make_host_key(h, fresh=True)
        self._restart(host)
        return self._record({"kind": "rekey", "host": host})

    def kill(self, host: str, pid: int, sig: int = signal.SIGKILL) -> int:
        """Signal the process that has PID `pid` inside the host; return its machine-wide PID."""
        init = self._init(host)
        host_ns = os.readlink(f"/proc/{init.pid}/ns/pid")
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.readlink(entry / "ns" / "pid") != host_ns:
                    continue
                nspid = next(ln for ln in (entry / "status").read_text().splitlines() if ln.startswith("NSpid:"))
            except (OSError, StopIteration):
                continue
            if nspid.split()[-1] == str(pid):
                if pid == 1:
                    raise LabError("pid 1 is the host's init; use `lab fault crash`")
                os.kill(int(entry.name), sig)
                return int(entry.name)
        raise LabError(f"no process {pid} on host {host}")

    def fill(self, host: str) -> dict[str, Any]:
        """Fill the host's disk directory (a small tmpfs) until writes fail with ENOSPC."""
        init = self._init(host)
        target = Path(f"/proc/{init.pid}/root") / self.plan.spec.run_dir.lstrip("/") / FILL_NAME
        block = b"\0" * (1 << 20)
        with open(target, "wb") as f:
            for _ in range(self.plan.host(host).host.disk_mib + 1):
                try:
                    f.write(block)
                    f.flush()
                except OSError:
                    break
        return self._record({"kind": "fill", "host": host})

    def tool(self, host: str, tool: str, exit_code: int, stderr: str, stdout: str = "") -> dict[str, Any]:
        if tool not in hostfs.DOUBLES:
            raise LabError(f"no double named {tool!r}; doubles are: {', '.join(hostfs.DOUBLES)}")
        path = self.plan.host(host).dir / "faults" / f"{tool}.json"
        path.write_text(json.dumps({"exit_code": exit_code, "stderr": stderr, "stdout": stdout}))
        return self._record({"kind": "tool", "host": host, "tool": tool, "exit_code": exit_code})

    def missing(self, host: str, tool: str) -> dict[str, Any]:
        """Make a real host tool (git, make, curl, ...) absent for the host's logins: /dev/null
        is bound over every copy on the session PATH inside the host's own mount namespace.
        Its mounts propagate one way (root -> host, `--propagation slave` in boot.py), so the
        machine's own tool is untouched."""
        if "/" in tool or not tool:
            raise LabError(f"{tool!r} is not a tool name")
        init = self._init(host)
        root = Path(f"/proc/{init.pid}/root")
        paths: list[str] = []  # each file once: /bin is often a link to /usr/bin
        for d in SESSION_PATH.split(":"):
            found = root / d.lstrip("/") / tool
            if found.exists():
                real = "/" + str(found.resolve().relative_to(root.resolve()))
                if real not in paths:
                    paths.append(real)
        if not paths:
            raise LabError(f"host {host} has no {tool} on its PATH to hide")
        for path in paths:
            run(["nsenter", "-t", str(init.pid), "-m", "--", "mount", "--bind", "/dev/null", path])
        return self._record({"kind": "missing", "host": host, "tool": tool, "paths": paths})

    def python(self, host: str, version: str) -> dict[str, Any]:
        """Make the host's `python3` an interpreter that reports `version` (say 3.10.12).

        The lab has no second CPython to install (Debian 12 ships 3.11 only; the portable
        builds download from GitHub, out of reach), so this is a double, like nvidia-smi's: in
        the host's own mount namespace the real interpreter is kept at a private path and a
        wrapper is bound over it that runs it with a sitecustomize setting sys.version and
        sys.version_info to `version` before any script. Only the host's logins see it; `-I`
        runs (the lab's own doubles) ignore it and stay on the real version."""
        parts = version.split(".")
        if len(parts) != 3 or not all(p.isdigit() and len(p) <= 3 for p in parts):
            raise LabError(f"{version!r} is not a version like 3.10.12")
        init = self._init(host)
        root = Path(f"/proc/{init.pid}/root")
        found = next((root / d.lstrip("/") / "python3" for d in SESSION_PATH.split(":")
                      if (root / d.lstrip("/") / "python3").exists()), None)
        if found is None:
            raise LabError(f"host {host} has no python3 on its PATH")
        real = "/" + str(found.resolve().relative_to(root.resolve()))
        fdir = self.plan.host(host).dir / "faults"
        keeper, wrapper, site = fdir / "python-real", fdir / "python3", fdir / "python-site"
        site.mkdir(parents=True, exist_ok=True)
        major, minor, micro = (int(p) for p in parts)
        (site / "sitecustomize.py").write_text("\n".join([
            f'"""Lab fault: this python3 reports {version}."""',
            "import collections, sys",
            "_info = collections.namedtuple('version_info', 'major minor micro releaselevel serial')",
            f"sys.version = {version!r} + sys.version[sys.version.index(' '):]",
            f"sys.version_info = _info({major}, {minor}, {micro}, 'final', 0)",
            f"sys.hexversion = {(major << 24) | (minor << 16) | (micro << 8) | 0xF0}", ""]))
        wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {keeper} \"$@\"\n")
        wrapper.chmod(0o755)
        keeper.write_text("")
        for src, dst in ((real, str(keeper)), (str(wrapper), real)):
            run(["nsenter", "-t", str(init.pid), "-m", "--", "mount", "--bind", src, dst])
        return self._record({"kind": "python", "host": host, "version": version,
                             "paths": [real, str(keeper)]})

    def image(self, host: str) -> dict[str, Any]:
        """Replace the engine image on one host by a rebuild under the same tag (one more
        environment line, so another Id): what an operator's `docker pull` of a moved tag
        does. Undone by restoring the host's image list."""
        data_path = self.plan.host(host).dir / "data" / "host.json"
        data = json.loads(data_path.read_text())
        if not data.get("images"):
            raise LabError(f"host {host} holds no engine image")
        rebuilt = self.plan.spec.image.model_copy(update={
            "env": [*self.plan.spec.image.env, "NARWHAL_LAB_REBUILT=1"]})
        before = data["images"]
        data["images"] = [identity.image_document(rebuilt)]
        data_path.write_text(json.dumps(data, indent=1))
        return self._record({"kind": "image", "host": host, "images": before,
                             "id": data["images"][0]["id"]})

    def rdma(self, host: str, device: str = "rxe0") -> dict[str, Any]:
        """Give a host a RoCE device on its fabric (what a NIC swap does): its inventory gains
        the device, so the ib_write_bw double runs, and /dev/infiniband gains its uverbs node.
        A fault rather than a spec variant because the lab is one session shared by every
        test; undone by restoring the inventory and removing the node."""
        data_path = self.plan.host(host).dir / "data" / "host.json"
        data = json.loads(data_path.read_text())
        hardware = data.setdefault("hardware", {})
        before = list(hardware.get("rdma") or [])
        if any(d["name"] == device for d in before):
            raise LabError(f"host {host} already has RDMA device {device}")
        hardware["rdma"] = [*before, {"name": device, "link_layer": "Ethernet"}]
        data_path.write_text(json.dumps(data, indent=1))
        node = f"/dev/infiniband/uverbs{len(before)}"
        root = Path(f"/proc/{self._init(host).pid}/root")
        (root / node.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / node.lstrip("/")).write_text("")
        return self._record({"kind": "rdma", "host": host, "device": device, "rdma": before,
                             "node": node})

    # undo ------------------------------------------------------------------
    def _undo(self, f: dict[str, Any]) -> None:
        kind = f["kind"]
        if kind == "shape":
            self._apply_shapes(f["src"])
        elif kind in ("loss", "block", "isolate"):
            host = f["dst"] if kind == "loss" else f["host"]
            run(in_netns(self.plan.host(host).netns, ["nft", "delete", "table", "inet", f"nwlab_{f['id']}"]),
                check=False)
        elif kind == "rdma":
            data_path = self.plan.host(f["host"]).dir / "data" / "host.json"
            data = json.loads(data_path.read_text())
            data.setdefault("hardware", {})["rdma"] = f["rdma"]
            data_path.write_text(json.dumps(data, indent=1))
            hs = self.state.hosts[f["host"]]
            if hs.init is not None and alive(hs.init):
                (Path(f"/proc/{hs.init.pid}/root") / f["node"].lstrip("/")).unlink(missing_ok=True)
        elif kind == "hub-cut":
            set_hub_route(self.plan, self.plan.host(f["host"]).netns, reachable=True, check=False)
        elif kind == "mtu":
            run(in_netns(self.plan.host(f["host"]).netns,
                         ["ip", "link", "set", "dev", FABRIC_IF, "mtu", str(f["before"])]),
                check=False)
        elif kind == "crash":
            self.boot(f["host"])
        elif kind == "rekey":
            key = self.plan.host(f["host"]).dir / "sshd" / "ssh_host_ed25519_key"
            for suffix in ("", ".pub"):
                os.replace(f"{key}{suffix}.orig", f"{key}{suffix}")
            self._restart(f["host"])
        elif kind == "fill":
            hs = self.state.hosts[f["host"]]
            if hs.init is not None and alive(hs.init):
                root = Path(f"/proc/{hs.init.pid}/root")
                (root / self.plan.spec.run_dir.lstrip("/") / FILL_NAME).unlink(missing_ok=True)
        elif kind == "image":
            data_path = self.plan.host(f["host"]).dir / "data" / "host.json"
            data = json.loads(data_path.read_text())
            data["images"] = f["images"]
            data_path.write_text(json.dumps(data, indent=1))
        elif kind == "tool":
            (self.plan.host(f["host"]).dir / "faults" / f"{f['tool']}.json").unlink(missing_ok=True)
        elif kind in ("missing", "python"):
            hs = self.state.hosts[f["host"]]
            if hs.init is not None and alive(hs.init):  # a rebooted host has none of it left
                for path in f["paths"]:  # -p: umount reads the host's own /proc/self
                    run(["nsenter", "-t", str(hs.init.pid), "-m", "-p", "--", "umount", path],
                        check=False)

    def clear(self, fault_id: int | None = None) -> list[dict[str, Any]]:
        """Undo one fault, or all of them newest first; return what was undone."""
        chosen = [f for f in self.state.faults if fault_id is None or f["id"] == fault_id]
        if fault_id is not None and not chosen:
            raise LabError(f"no active fault with id {fault_id}")
        for f in reversed(chosen):
            self.state.faults = [g for g in self.state.faults if g["id"] != f["id"]]
            self.state.save(self.state_path)
            self._undo(f)
        return chosen


def with_faults(state_path: Path) -> Faults:
    return Faults(state_path)


__all__ = ["Faults", "locked", "with_faults"]
