"""Checks between engines that share one physical host: ports and GPUs must not collide.

Engines are grouped by `Destination.machine` (canonical host, SSH port), not by the text of
their destinations: `root@10.0.0.5`, `ops@10.0.0.5` and `ssh://root@10.0.0.5:22` all log in to
one sshd, so one machine, whose ports its engines share. A different SSH port on one address
stays a different machine (a NAT gateway forwarding each port to its own host).

GPUs are judged by core/gpu_sharing's rule, the one discovery applies to resolved UUIDs on the
machine it measured. Without facts this check can only feed it spellings (`0` and `00` are one
spelling, a UUID's case does not count), so it finds a sharing only where discovery will, and
NARWHAL_SHARED_GPU_ALLOWANCE settles both alike. An index here and its UUID there, or two
addresses of one machine, are discovery's to find.
"""

from __future__ import annotations

from collections.abc import Callable

from narwhal.core.errors import Problem
from narwhal.core.gpu_sharing import (
    ALLOWANCE_FIX,
    Allocation,
    canonical_spelling,
    forbidden,
    machine_key,
)
from narwhal.deploy.inputs.model import EngineInputs

PORT_FIELDS = {"ENGINE_PORT": "engine_port", "ATTEST_PORT": "attest_port",
               "NIXL_SIDE_CHANNEL_PORT": "nixl_side_channel_port",
               "KV_EVENTS_PORT": "kv_events_port"}  # optional: None when unset


def check_colocation(engines: list[EngineInputs], var: Callable[[int, str], str],
                     shared_gpu_allowance: bool = False) -> list[Problem]:
    """Engines on one SSH destination share its ports and GPUs; report every collision."""
    problems: list[Problem] = []
    by_host: dict[tuple[str, int], list[EngineInputs]] = {}
    for engine in engines:
        by_host.setdefault(engine.ssh.machine, []).append(engine)
    for group in by_host.values():
        used: dict[int, str] = {}
        for engine in group:
            for field, attr in PORT_FIELDS.items():
                port = getattr(engine, attr)
                if port is None:
                    continue
                key = var(engine.n, field)
                user = f"{engine.role} {field.lower().replace('_', ' ')}"
                if port in used:
                    problems.append(Problem(
                        key, f"{user} {port} collides with {used[port]} on the same host "
                        f"({_where(group)})",
                        "give every engine, attestation, side-channel and KV events port on a "
                        "host its own number (set NARWHAL_NODE_<n>_... overrides)"))
                else:
                    used[port] = user
        if len(group) > 1:
            problems += _gpu_problems(group, var, shared_gpu_allowance)
    return problems


def _where(group: list[EngineInputs]) -> str:
    """The destinations of one machine as written, each once."""
    return ", ".join(dict.fromkeys(e.ssh.text for e in group))


def _gpu_problems(group: list[EngineInputs], var: Callable[[int, str], str],
                  allowance: bool) -> list[Problem]:
    """One GPU written alike by two engines of one SSH machine: gpu_sharing's rule over
    canonical spellings. An engine without GPU_IDS takes every GPU, so it shares them all."""
    problems = [Problem(f"NARWHAL_NODE_{e.n}_GPU_IDS", "is required: several engines share "
                        "this host",
                        "give each colocated engine its own GPUs, e.g. 0,1 and 2,3, or set "
                        "NARWHAL_SHARED_GPU_ALLOWANCE=true to let them share")
                for e in group if e.gpu_ids is None and not allowance]
    spelt = {e.role: {canonical_spelling(g): g for g in e.gpu_ids} for e in group if e.gpu_ids}
    by_role = {e.role: e for e in group}
    machine = machine_key(None, group[0].ssh.machine)  # the best this check can know
    for s in forbidden([Allocation(role, machine, tuple(gpus)) for role, gpus in spelt.items()],
                       allowance):
        holder = by_role[s.holder]
        problems.append(Problem(var(by_role[s.engine].n, "GPU_IDS"),
                                f"GPU {spelt[s.engine][s.gpu]} is also allocated to {s.holder} "
                                f"({var(holder.n, 'GPU_IDS')}) on the same host "
                                f"({_where(group)})", ALLOWANCE_FIX))
    return problems
