"""Checks between engines that share one physical host: ports and GPUs must not collide.

Engines are grouped by `Destination.machine` (canonical host, SSH port), not by the text of
their destinations: `root@10.0.0.5`, `ops@10.0.0.5` and `ssh://root@10.0.0.5:22` all log in to
one sshd, so one machine, whose ports its engines share. A different SSH port on one address
stays a different machine (a NAT gateway forwarding each port to its own host).
"""

from __future__ import annotations

from collections.abc import Callable

from narwhal.core.errors import Problem
from narwhal.deploy.inputs.model import EngineInputs

PORT_FIELDS = {"ENGINE_PORT": "engine_port", "ATTEST_PORT": "attest_port",
               "NIXL_SIDE_CHANNEL_PORT": "nixl_side_channel_port"}


def check_colocation(engines: list[EngineInputs], var: Callable[[int, str], str]) -> list[Problem]:
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
                key = var(engine.n, field)
                user = f"{engine.role} {field.lower().replace('_', ' ')}"
                if port in used:
                    problems.append(Problem(
                        key, f"{user} {port} collides with {used[port]} on the same host "
                        f"({_where(group)})",
                        "give every engine, attestation and side-channel port on a host its own "
                        "number (set NARWHAL_NODE_<n>_... overrides)"))
                else:
                    used[port] = user
        if len(group) > 1:
            problems += _gpu_problems(group, var)
    return problems


def _where(group: list[EngineInputs]) -> str:
    """The destinations of one machine as written, each once."""
    return ", ".join(dict.fromkeys(e.ssh.text for e in group))


def _gpu_problems(group: list[EngineInputs], var: Callable[[int, str], str]) -> list[Problem]:
    problems: list[Problem] = []
    owner: dict[str, str] = {}
    for engine in group:
        key = var(engine.n, "GPU_IDS")
        if engine.gpu_ids is None:
            problems.append(Problem(f"NARWHAL_NODE_{engine.n}_GPU_IDS",
                                    "is required: several engines share this host",
                                    "give each colocated engine its own GPUs, e.g. 0,1 and 2,3"))
            continue
        for gpu in engine.gpu_ids:
            if gpu in owner and engine.gpu_memory_utilization is None:
                problems.append(Problem(key, f"GPU {gpu} is already allocated by {owner[gpu]}",
                                        "give colocated engines disjoint GPU_IDS"))
            owner.setdefault(gpu, key)
    return problems
