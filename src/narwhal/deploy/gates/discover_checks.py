"""Gate A's relations: each engine's inputs against the facts measured on its own host.

Pure functions over plain records (the host-facts documents, validated, as dicts): facts in,
problems and a derived per-engine plan out, so every bad case is testable without a host.
Every problem names the host alias, the `.env` field it concerns, what was found and the fix;
all of them are reported in one pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from narwhal.core.errors import Problem
from narwhal.core.gpu_sharing import ALLOWANCE_FIX, Allocation, forbidden, machine_key, resolve
from narwhal.deploy.inputs.model import EngineInputs, Inputs

MIN_PYTHON = (3, 11)
ENGINE_TOOLS = ("git", "make", "curl")
SSHPASS_FIX = ("apt-get install sshpass, or use key auth (NARWHAL_SSH_KEY) instead of the "
               "password(s)")


@dataclass
class EnginePlan:
    """What discovery derived for one engine from its host's facts."""

    engine: EngineInputs
    host: str
    machine: str = ""  # the physical machine as measured (gpu_sharing.machine_key)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    accelerator: str = "none"  # the GPUs' vendor, as the host's driver tool reported it
    tensor_parallel_size: int = 1
    fabric_address: str = ""
    fabric_mtu: int = 0
    image: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)

    def allocation(self) -> Allocation:
        """This engine's GPUs for the sharing rule: its measured machine, the GPUs' UUIDs."""
        return Allocation(self.engine.role, self.machine or f"host:{self.host}",
                          tuple(str(g.get("uuid")) for g in self.gpus))

    def as_json(self) -> dict[str, Any]:
        e = self.engine
        return {
            "engine": e.role, "host": self.host, "machine": self.machine,
            "accelerator": self.accelerator,
            "gpus": [{k: g.get(k) for k in ("index", "uuid", "pci_bus_id", "name",
                                             "memory_total_mib", "numa_node", "render_node")}
                     for g in self.gpus],
            "tensor_parallel_size": self.tensor_parallel_size,
            "fabric": {"interface": e.fabric_interface, "address": self.fabric_address,
                       "mtu": self.fabric_mtu},
            "ports": {"engine": e.engine_port, "attest": e.attest_port,
                      "nixl_side_channel": e.nixl_side_channel_port,
                      "ucx_tcp": list(e.ucx_tcp_port_range),
                      **({"kv_events": e.kv_events_port} if e.kv_events_port else {})},
            "image": self.image, "model": self.model, "run_dir": e.run_dir,
        }


def _var(engine: EngineInputs, field_name: str) -> str:
    return f"NARWHAL_NODE_{engine.n}_{field_name}"


def _p(host: str, field_name: str, problem: str, fix: str) -> Problem:
    return Problem(f"{host}: {field_name}", problem, fix)


def host_problems(alias: str, facts: Mapping[str, Any], role: str) -> list[Problem]:
    """What a host needs whatever its engines: Python, tools, the runtime (engine hosts)."""
    problems: list[Problem] = []
    py = facts.get("python") or {}
    version = tuple(int(x) for x in str(py.get("version") or "0").split(".")[:2] if x.isdigit())
    if version < MIN_PYTHON:
        problems.append(_p(alias, "python3", f"Python {py.get('version') or 'is missing'} "
                           f"(needs {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer)",
                           "install python3.11 (with venv) on the host"))
    elif not py.get("has_venv"):
        problems.append(_p(alias, "python3", "the venv module is missing",
                           "install the python3-venv package"))
    if role == "engine":
        tools = facts.get("tools") or {}
        for tool in ENGINE_TOOLS:
            if not (tools.get(tool) or {}).get("path"):
                problems.append(_p(alias, tool, f"{tool} is not installed",
                                   f"install {tool} on the host"))
    return problems


def password_fields(inputs: Inputs) -> list[str]:
    """The .env variables that make a login use a password: each one is typed through sshpass
    on the workstation."""
    secrets = [e.ssh_password for e in inputs.engines] + [inputs.router.ssh_password]
    return list(dict.fromkeys(s.name for s in secrets if s is not None))


def workstation_problems(facts: Mapping[str, Any] | None,
                         passwords: Sequence[str]) -> list[Problem]:
    """Without sshpass on the workstation no password login can start (each such host fails
    to connect), so this is said once, naming every variable that needs it. Nothing is judged
    when the workstation could not be inspected: that is its own problem already."""
    if not passwords or facts is None:
        return []
    if ((facts.get("tools") or {}).get("sshpass") or {}).get("path"):
        return []
    return [_p("workstation", ", ".join(passwords),
               "sshpass is not installed, and password SSH needs it", SSHPASS_FIX)]


def _select_gpus(engine: EngineInputs, host: str, gpus: list[dict[str, Any]],
                 problems: list[Problem]) -> list[dict[str, Any]]:
    """The host's GPUs that GPU_IDS names, each resolved to the GPU itself (an index or a
    UUID, however spelt), so that every later comparison is by the driver's UUID."""
    if engine.gpu_ids is None:
        return gpus
    chosen: dict[str, dict[str, Any]] = {}
    missing = []
    for entry in engine.gpu_ids:
        gpu = resolve(entry, gpus)
        if gpu is None:
            missing.append(entry)
        elif str(gpu.get("uuid")) in chosen:
            problems.append(_p(host, _var(engine, "GPU_IDS"),
                               f"{entry} names GPU {gpu.get('index')} a second time",
                               "name each GPU once"))
        else:
            chosen[str(gpu.get("uuid"))] = gpu
    if missing:
        found = ", ".join(f"{g.get('index')} ({g.get('uuid')})" for g in gpus) or "none"
        problems.append(_p(host, _var(engine, "GPU_IDS"),
                           f"GPU(s) {', '.join(missing)} do not exist on this host; it has: "
                           f"{found}", "name GPUs by the indexes or UUIDs listed"))
    return list(chosen.values())


def _fabric(engine: EngineInputs, host: str, facts: Mapping[str, Any],
            plan: EnginePlan, problems: list[Problem]) -> None:
    iface = facts.get("fabric_interface")
    if not iface:
        names = ", ".join(i.get("name", "?") for i in facts.get("interfaces") or []) or "none"
        problems.append(_p(host, _var(engine, "FABRIC_INTERFACE"),
                           f"interface {engine.fabric_interface!r} does not exist (found: {names})",
                           "name the host's fabric interface"))
        return
    plan.fabric_mtu = int(iface.get("mtu") or 0)
    addresses = [a.get("address") for a in iface.get("addresses") or []
                 if a.get("scope") in (None, "global", "universe")]
    if engine.ip is not None:
        if engine.ip not in addresses:
            problems.append(_p(host, _var(engine, "IP"),
                               f"{engine.ip} is not an address of {engine.fabric_interface} "
                               f"(it has: {', '.join(map(str, addresses)) or 'none'})",
                               "set the address the interface carries, or fix the interface"))
        plan.fabric_address = engine.ip
    elif addresses:
        plan.fabric_address = str(addresses[0])
    else:
        problems.append(_p(host, _var(engine, "FABRIC_INTERFACE"),
                           f"{engine.fabric_interface} has no global address",
                           "configure the fabric address on the interface"))


def _listeners(engine: EngineInputs, host: str, facts: Mapping[str, Any],
               problems: list[Problem]) -> None:
    ports = {engine.engine_port: "ENGINE_PORT", engine.attest_port: "ATTEST_PORT",
             engine.nixl_side_channel_port: "NIXL_SIDE_CHANNEL_PORT"}
    if engine.kv_events_port is not None:
        ports[engine.kv_events_port] = "KV_EVENTS_PORT"
    for row in facts.get("listeners") or []:
        name = ports.get(int(row.get("port", 0)))
        if name is None:
            continue
        owner = row.get("process") or "an unknown process"
        pid = f" (pid {row['pid']})" if row.get("pid") else ""
        problems.append(_p(host, _var(engine, name),
                           f"port {row['port']} is already listening on {row.get('address')}, "
                           f"owned by {owner}{pid}",
                           "stop that process or give this engine another port"))


def _dirs(engine: EngineInputs, host: str, facts: Mapping[str, Any],
          problems: list[Problem]) -> None:
    disk = facts.get("disk") or {}
    run = disk.get(engine.run_dir) or {}
    if not run.get("exists") or not run.get("is_dir"):
        problems.append(_p(host, _var(engine, "RUN_DIR"), f"{engine.run_dir} does not exist",
                           "create it on the host (writable by the SSH user)"))
    elif not run.get("writable"):
        problems.append(_p(host, _var(engine, "RUN_DIR"), f"{engine.run_dir} is not writable",
                           "give the SSH user write access"))


def _image(engine: EngineInputs, host: str, facts: Mapping[str, Any], plan: EnginePlan,
           problems: list[Problem]) -> None:
    image = facts.get("image") or {}
    if not image.get("found"):
        why = image.get("error") or "not present"
        problems.append(_p(host, _var(engine, "ENGINE_IMAGE"),
                           f"image {engine.engine_image} is not on the host ({why})",
                           "load or pull the approved image on this host"))
        return
    plan.image = {"ref": engine.engine_image, "id": image.get("id"),
                  "repo_digests": image.get("repo_digests") or [],
                  "packages": image.get("packages") or {}}


def _model(engine: EngineInputs, host: str, facts: Mapping[str, Any], plan: EnginePlan,
           problems: list[Problem]) -> None:
    model = facts.get("model") or {}
    if not model.get("exists"):
        problems.append(_p(host, _var(engine, "MODEL_DIR"), f"{engine.model_dir} does not exist",
                           "stage the approved checkpoint there"))
        return
    if model.get("error"):
        problems.append(_p(host, _var(engine, "MODEL_DIR"), str(model["error"]),
                           "fix the checkpoint tree, then rerun discovery"))
        return
    pin = engine.model_config_sha256
    if pin and model.get("config_sha256") != pin:
        problems.append(_p(host, _var(engine, "MODEL_CONFIG_SHA256"),
                           f"config.json has sha256 {model.get('config_sha256')}, not the pinned "
                           f"{pin}", "stage the approved checkpoint, or correct the pin"))
    plan.model = {"dir": engine.model_dir, "model_tree_sha256": model.get("model_tree_sha256"),
                  "config_sha256": model.get("config_sha256"),
                  "needs_trust_remote_code": bool(model.get("needs_trust_remote_code"))}


def engine_plan(engine: EngineInputs, host: str, facts: Mapping[str, Any],
                problems: list[Problem]) -> EnginePlan:
    """One engine's allocation and resources checked against its host; problems appended."""
    # Two sessions (logins, addresses) that measured one machine id are one machine.
    plan = EnginePlan(engine, host, machine_key(facts.get("machine_id_hmac"),
                                                engine.ssh.machine))
    acc = facts.get("accelerators") or {}
    if acc.get("error"):
        problems.append(_p(host, "accelerators", f"GPU inspection failed: {acc['error']}",
                           "install or repair the GPU driver and its tool (nvidia-smi, "
                           "rocminfo) on the host"))
    gpus = list(acc.get("gpus") or [])
    if not gpus and not acc.get("error"):
        problems.append(_p(host, "accelerators", "no GPU found",
                           "run engines only on hosts with GPUs"))
    plan.gpus = _select_gpus(engine, host, gpus, problems)
    plan.accelerator = str(acc.get("vendor") or "none") if plan.gpus else "none"
    tp = engine.tensor_parallel_size or max(1, len(plan.gpus))
    plan.tensor_parallel_size = tp
    if plan.gpus and tp > len(plan.gpus):
        problems.append(_p(host, _var(engine, "TENSOR_PARALLEL_SIZE"),
                           f"TP {tp} is larger than the {len(plan.gpus)} GPU(s) allocated",
                           "lower TP or allocate more GPUs"))
    _fabric(engine, host, facts, plan, problems)
    _listeners(engine, host, facts, problems)
    _dirs(engine, host, facts, problems)
    _image(engine, host, facts, plan, problems)
    _model(engine, host, facts, plan, problems)
    return plan


def fleet_problems(plans: Sequence[EnginePlan],
                   rows_by_host: Mapping[str, Sequence[Sequence[Any]]],
                   shared_gpus: bool = False) -> list[Problem]:
    """Relations across engines: sizes, disjoint GPUs on each measured machine (unless
    NARWHAL_SHARED_GPU_ALLOWANCE lets colocated engines share one; Gate C then starts them one
    after another), one product and shape, equal image and checkpoint everywhere (a difference
    names the host and the first differing path)."""
    problems: list[Problem] = []
    if len(plans) < 2:
        problems.append(Problem("engines", f"{len(plans)} engine(s); disaggregated serving "
                                "needs at least 2", "add NARWHAL_NODE_<n>_SSH for another engine"))
    problems += _shared_gpus(plans, shared_gpus)
    products = {str(g.get("name")) for p in plans for g in p.gpus}
    if len(products) > 1:
        problems.append(Problem("engines", f"mixed GPU products: {', '.join(sorted(products))}",
                                "run one product per fleet (one cache geometry for every pair)"))
    shapes = {(len(p.gpus), p.tensor_parallel_size) for p in plans if p.gpus}
    if len(shapes) > 1:
        shown = ", ".join(f"{p.engine.role}: {len(p.gpus)} GPU / TP {p.tensor_parallel_size}"
                          for p in plans)
        problems.append(Problem("engines", f"engines differ in shape ({shown})",
                                "give every engine the same GPU count and TP"))
    problems += _same_everywhere(plans, "image", "id", "ENGINE_IMAGE",
                                 "load the same image (by digest) on every host")
    problems += _checkpoints(plans, rows_by_host)
    return problems


def _shared_gpus(plans: Sequence[EnginePlan], allowance: bool) -> list[Problem]:
    """GPUs two engines hold on one measured machine (gpu_sharing's rule, by UUID), even when
    each reached it through its own SSH login or address."""
    by_role = {p.engine.role: p for p in plans}
    problems = []
    for s in forbidden([p.allocation() for p in plans], allowance):
        plan, holder = by_role[s.engine], by_role[s.holder]
        index = next(g.get("index") for g in plan.gpus if str(g.get("uuid")) == s.gpu)
        where = "" if holder.host == plan.host else f" on {holder.host} (the same machine)"
        problems.append(_p(plan.host, _var(plan.engine, "GPU_IDS"),
                           f"GPU {index} ({s.gpu}) is also allocated to {s.holder}{where}",
                           ALLOWANCE_FIX))
    return problems


def _same_everywhere(plans: Sequence[EnginePlan], part: str, key: str, field_name: str,
                     fix: str) -> list[Problem]:
    seen = [(p, getattr(p, part).get(key)) for p in plans if getattr(p, part).get(key)]
    if len({v for _, v in seen}) <= 1:
        return []
    first_plan, first = seen[0]
    return [_p(p.host, _var(p.engine, field_name),
               f"{part} {key} {v} differs from {first} on {first_plan.host}", fix)
            for p, v in seen[1:] if v != first]


def _checkpoints(plans: Sequence[EnginePlan],
                 rows_by_host: Mapping[str, Sequence[Sequence[Any]]]) -> list[Problem]:
    seen = [p for p in plans if p.model.get("model_tree_sha256")]
    if len({p.model["model_tree_sha256"] for p in seen}) <= 1:
        return []
    reference = seen[0]
    ref_rows = {str(r[0]): (r[1], r[2]) for r in rows_by_host.get(reference.host, ())}
    problems = []
    for plan in seen[1:]:
        if plan.model["model_tree_sha256"] == reference.model["model_tree_sha256"]:
            continue
        rows = {str(r[0]): (r[1], r[2]) for r in rows_by_host.get(plan.host, ())}
        differing = sorted(k for k in set(ref_rows) | set(rows) if ref_rows.get(k) != rows.get(k))
        where = differing[0] if differing else "(unknown file)"
        problems.append(_p(plan.host, _var(plan.engine, "MODEL_DIR"),
                           f"checkpoint differs from {reference.host}'s: first differing file "
                           f"{where} ({len(differing)} differ)",
                           "stage the same checkpoint on every host"))
    return problems


def all_problems(inputs: Inputs, facts: Mapping[str, Mapping[str, Any]],
                 host_of: Mapping[str, str], workstation: Mapping[str, Any] | None = None,
                 ) -> tuple[list[Problem], list[EnginePlan]]:
    """Every problem of the fleet in one pass, and the per-engine plans (valid when none).
    `facts` are the hosts'; the workstation's (None: not inspected) are judged on their own."""
    problems = workstation_problems(workstation, password_fields(inputs))
    roles = {alias: ("engine" if any(h == alias for h in host_of.values()) else "router")
             for alias in facts}
    for alias, doc in facts.items():
        problems += host_problems(alias, doc, roles[alias])
    plans = [engine_plan(e, host_of[e.role], facts[host_of[e.role]], problems)
             for e in inputs.engines if host_of.get(e.role) in facts]
    rows = {alias: (doc.get("model") or {}).get("rows") or [] for alias, doc in facts.items()}
    problems += fleet_problems(plans, rows, bool(inputs.shared_gpu_allowance))
    return problems, plans
