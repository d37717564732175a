"""Whether engines share a GPU: the one rule, over GPUs as discovery resolved them.

A GPU is a (machine, UUID) pair. The machine is what discovery measured there, a keyed digest
of /etc/machine-id, so two SSH logins (`root@10.0.0.5`, `ops@10.0.0.5`) or two addresses of
one host are one machine; only a host without a machine id falls back to its SSH machine
(address and port as the .env wrote them). The UUID is the driver's, whatever the .env wrote
for it: `0`, `00` or `GPU-...` in either case. Discovery (Gate A) judges every allocation with
`sharings` and Gate C orders its starts with `share_groups`, both over those pairs.

The `.env` check has no facts: it feeds the same rule each entry's canonical spelling on one
SSH machine, which can only match where the resolved UUIDs match too. So whatever it finds
(one GPU written the same way twice), discovery finds as well, and NARWHAL_SHARED_GPU_ALLOWANCE
settles both the same way: a sharing is a problem exactly when the allowance is not given.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

INDEX_RE = re.compile(r"[0-9]{1,3}")
ALLOWANCE_FIX = ("give colocated engines disjoint GPUs, or set NARWHAL_SHARED_GPU_ALLOWANCE=true "
                 "to let them share (they start one after another)")
Gpu = TypeVar("Gpu", bound=Mapping[str, Any])


@dataclass(frozen=True)
class Allocation:
    """One engine's GPUs on one machine: UUIDs as resolved (before discovery: spellings)."""

    engine: str
    machine: str
    gpus: tuple[str, ...]


@dataclass(frozen=True)
class Sharing:
    """`engine` holds `gpu` of `machine`, which `holder`, earlier in the fleet, holds too."""

    engine: str
    holder: str
    machine: str
    gpu: str


def machine_key(machine_id_hmac: str | None, ssh_machine: tuple[str, int]) -> str:
    """What a machine is called for its GPUs: its measured id, else its SSH address and port."""
    if machine_id_hmac:
        return f"machine-id:{machine_id_hmac}"
    host, port = ssh_machine
    return f"ssh:{host}:{port}"


def canonical_spelling(entry: str) -> str:
    """One spelling per GPU_IDS entry, without facts: an index as its number (`00` is `0`), a
    UUID in lower case (nvidia-smi prints lower case; the .env grammar takes either)."""
    return f"index:{int(entry)}" if INDEX_RE.fullmatch(entry) else f"uuid:{entry.lower()}"


def resolve(entry: str, gpus: Sequence[Gpu]) -> Gpu | None:
    """The host's GPU that a GPU_IDS entry names, by index or UUID however spelt; None if
    the host has no such GPU."""
    wanted = canonical_spelling(entry)
    for gpu in gpus:
        if wanted in (f"index:{gpu.get('index')}", f"uuid:{str(gpu.get('uuid')).lower()}"):
            return gpu
    return None


def sharings(allocations: Sequence[Allocation]) -> list[Sharing]:
    """Every GPU an engine holds that an earlier engine on the same machine holds too."""
    holder: dict[tuple[str, str], str] = {}
    found = []
    for a in allocations:
        for gpu in dict.fromkeys(a.gpus):
            first = holder.setdefault((a.machine, gpu), a.engine)
            if first != a.engine:
                found.append(Sharing(a.engine, first, a.machine, gpu))
    return found


def forbidden(allocations: Sequence[Allocation], allowance: bool) -> list[Sharing]:
    """The sharings that are problems: every one, unless NARWHAL_SHARED_GPU_ALLOWANCE."""
    return [] if allowance else sharings(allocations)


def share_groups(allocations: Sequence[Allocation]) -> list[list[str]]:
    """Engines linked by a shared GPU, directly or through others, in fleet order: one group
    starts one engine after another (vLLM sizes its cache from the memory it finds free while
    it starts), and the groups start at once."""
    group_of = {a.engine: [a.engine] for a in allocations}
    for s in sharings(allocations):
        kept, merged = group_of[s.holder], group_of[s.engine]
        if kept is not merged:
            kept.extend(merged)
            group_of.update((engine, kept) for engine in merged)
    order = {a.engine: i for i, a in enumerate(allocations)}
    groups: list[list[str]] = []
    seen: set[int] = set()
    for a in allocations:  # fleet order: a group is met first at its earliest engine
        group = group_of[a.engine]
        if id(group) not in seen:
            seen.add(id(group))
            groups.append(sorted(group, key=order.__getitem__))
    return groups
