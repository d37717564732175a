"""The run plan against the host as it is now (`narwhal-engine check`).

Gate A measured the host; time has passed since. Before anything starts, every fact the plan
depends on is measured again with the discovery probe's own collectors: the GPUs (by index,
UUID and bus id, and their device nodes), the image Id, the checkpoint tree digest, the run
dir, the fabric address on its interface, and that no planned port has a listener (its
owner is named). Each failed check names the field, what was found and the fix.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from narwhal.node import host_probe as hp
from narwhal.node.engine.runtimes import choose


def _check(name: str, ok: bool, found: Any, fix: str = "") -> dict[str, Any]:
    return {"check": name, "ok": ok, "found": found, "fix": "" if ok else fix}


def _vendor_facts(accelerator: str, sys_root: str) -> dict[str, Any]:
    if accelerator == "amd":
        return hp.amd_facts(shutil.which("rocminfo"), sys_root)
    return hp.nvidia_facts(shutil.which("nvidia-smi"), sys_root)


def _nodes(plan: dict[str, Any], d: dict[str, Any], dev_root: str) -> list[str]:
    """The device nodes this GPU is reached through (the runtime refuses a missing one)."""
    if plan["accelerator"] == "amd":
        return [os.path.join(dev_root, "kfd"),
                os.path.join(dev_root, str(d["render_node"]).removeprefix("/dev/"))]
    return [os.path.join(dev_root, f"nvidia{d['index']}")]


def gpus(plan: dict[str, Any], dev_root: str = "/dev", sys_root: str = "/sys"
         ) -> list[dict[str, Any]]:
    if not plan["devices"]:  # a CPU engine: nothing to allocate
        return []
    facts = _vendor_facts(plan["accelerator"], sys_root)
    if facts["error"]:
        return [_check("gpus", False, facts["error"], "fix the driver, then check again")]
    live = {g["uuid"]: g for g in facts["gpus"]}
    out = []
    for d in plan["devices"]:
        g = live.get(d["uuid"])
        missing = [n for n in _nodes(plan, d, dev_root) if not os.path.exists(n)]
        if g is None:
            out.append(_check(f"gpu {d['index']}", False, f"{d['uuid']} is not on this host "
                              f"(it has {', '.join(sorted(live)) or 'none'})",
                              "run `narwhal discover` again: the GPUs changed"))
        elif g["index"] != d["index"] or g["pci_bus_id"] != d["pci_bus_id"]:
            out.append(_check(f"gpu {d['index']}", False, f"{d['uuid']} is now index "
                              f"{g['index']} at {g['pci_bus_id']}",
                              "run `narwhal discover` again: the GPUs were renumbered"))
        elif plan["accelerator"] == "amd" and g.get("render_node") != d["render_node"]:
            out.append(_check(f"gpu {d['index']}", False, f"{d['uuid']} now renders at "
                              f"{g.get('render_node')}, the plan says {d['render_node']}",
                              "run `narwhal discover` again: the render nodes changed"))
        elif missing:
            out.append(_check(f"gpu {d['index']}", False, f"{', '.join(missing)} is missing",
                              "load the driver (its device nodes), then check again"))
        else:
            out.append(_check(f"gpu {d['index']}", True, f"{d['uuid']} at {d['pci_bus_id']}"))
    if len(plan["devices"]) < plan["tensor_parallel_size"]:
        out.append(_check("tensor parallel size", False, f"TP {plan['tensor_parallel_size']} "
                          f"on {len(plan['devices'])} GPU(s)", "allocate a GPU per TP rank"))
    return out


def image(plan: dict[str, Any], runtime: str) -> dict[str, Any]:
    tool = shutil.which(runtime)
    if tool is None:
        return _check("image", False, f"{runtime} is not on PATH", f"install {runtime}")
    ran = hp.run([tool, "image", "inspect", plan["image_id"]])
    if not ran.ok:
        return _check("image", False, ran.problem(), "load the pinned image on this host "
                      "(by its Id), then check again")
    try:
        image_id, _ = hp.parse_image_inspect(ran.stdout)
    except ValueError as exc:
        return _check("image", False, str(exc), "check the container runtime")
    return _check("image", image_id == plan["image_id"], image_id,
                  "the host's image differs from Gate A's: load the pinned one")


def checkpoint(plan: dict[str, Any]) -> dict[str, Any]:
    facts = hp.model_facts(plan["model_dir"], True)
    got = facts.get("model_tree_sha256")
    if facts.get("error"):
        return _check("checkpoint", False, facts["error"], "restore the checkpoint Gate A hashed")
    if got != plan["model_tree_sha256"]:
        return _check("checkpoint", False, f"model_tree_sha256 {got} (Gate A: "
                      f"{plan['model_tree_sha256']})", "restore the checkpoint Gate A hashed, "
                      "or run `narwhal discover` again if the change is intended")
    return _check("checkpoint", True, got)


# What an engine's run dir needs free before a start: its state files, the engine log and
# the sidecar's lease state. A full disk fails here, named, before any container exists.
RUN_DIR_MIN_FREE_BYTES = 8 << 20


def failed(name: str, found: str, fix: str) -> dict[str, Any]:
    """A check that failed outside `run_all` (its result could not be written, say)."""
    return _check(name, False, found, fix)


def run_dir(plan: dict[str, Any]) -> dict[str, Any]:
    facts = hp.disk_facts(plan["run_dir"])
    if not facts["writable"]:
        return _check("run dir", False, facts, f"create {plan['run_dir']} and make it writable")
    free = facts["free_bytes"]
    if free is not None and free < RUN_DIR_MIN_FREE_BYTES:
        return _check("run dir", False, f"{plan['run_dir']}: only {free >> 20} MiB free "
                      f"(disk full)", f"free at least {RUN_DIR_MIN_FREE_BYTES >> 20} MiB on "
                      f"the filesystem of {plan['run_dir']}, then run the gate again")
    return _check("run dir", True, facts)


def fabric(plan: dict[str, Any]) -> dict[str, Any]:
    interfaces = hp.interface_facts(shutil.which("ip"))
    iface = next((i for i in interfaces if i["name"] == plan["fabric_interface"]), None)
    if iface is None:
        return _check("fabric", False, f"no interface {plan['fabric_interface']}",
                      "bring the fabric interface up")
    addresses = [a["address"] for a in iface.get("addresses", [])]
    return _check("fabric", plan["fabric_address"] in addresses,
                  f"{plan['fabric_interface']}: {', '.join(addresses) or 'no address'}",
                  f"give {plan['fabric_interface']} the address {plan['fabric_address']}")


def ports(plan: dict[str, Any]) -> dict[str, Any]:
    planned = [plan["ports"]["engine"], plan["ports"]["nixl_side_channel"]]
    if plan["ports"].get("kv_events"):  # the KV events publisher binds it at start
        planned.append(plan["ports"]["kv_events"])
    busy = hp.listener_facts(shutil.which("ss"), planned)
    if busy:
        said = ", ".join(f"{b['port']} ({b.get('process') or 'owner unknown'}"
                         f"{' pid ' + str(b['pid']) if b.get('pid') else ''})" for b in busy)
        return _check("ports", False, f"already listening: {said}",
                      "stop the process holding the port, or choose another port in the .env")
    return _check("ports", True, planned)


def run_all(plan: dict[str, Any], runtime: str) -> list[dict[str, Any]]:
    found = [*gpus(plan), checkpoint(plan), run_dir(plan), fabric(plan), ports(plan)]
    if choose(runtime).contained:  # a process has no image to hold
        found.insert(1, image(plan, runtime))
    return found
