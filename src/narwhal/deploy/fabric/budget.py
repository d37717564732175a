"""What each directed host edge must carry: the budget document of Gate D.

Engines with one compatibility hash are one cache-equivalence group: they hold the same
geometry, so one payload per handoff serves the whole group. The payload is what every
consumer rank reads for one prompt (core/kv's request transfer, from the geometry Gate C
verified against the live engine: MLA, hybrid and heterogeneous TP included). The workload's
full handoff rate applies to every directed edge independently (the runbook's model: any
producer may hand any consumer the whole load); an edge into a host with several consumer
groups must carry the largest of their budgets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from narwhal.core.documents import stamp
from narwhal.core.kv import budget as kvb
from narwhal.core.kv.geometry import Geometry
from narwhal.core.kv.transfer import request_transfer
from narwhal.deploy.inputs.model import Workload

SCHEMA = "narwhal.fabric-budget"
VERSION = 1


def kv_workload(w: Workload) -> kvb.Workload:
    """The operator's workload (.env) as core/kv's budget inputs (the transfer budget in s)."""
    return kvb.Workload(prompt_tokens=w.prompt_tokens, handoffs_per_s=w.handoffs_per_s,
                        burst=w.burst, transfer_budget_s=w.transfer_budget_ms / 1000.0,
                        headroom=w.headroom)


def payload_budget(payload_bytes: int, w: Workload) -> kvb.Budget:
    """Required Gbit/s for `payload_bytes` per handoff under the operator's workload."""
    return kvb.required_gbps(payload_bytes, kv_workload(w))


@dataclass(frozen=True)
class EdgeBudget:
    edge: str
    source: str
    destination: str
    required_gbps: float
    group: str  # the consumer group whose budget is the edge's
    consumers: tuple[str, ...]


def edge_name(source: str, destination: str) -> str:
    return f"{source}->{destination}"


def budget_document(geometries: Mapping[str, Geometry], engine_hosts: Mapping[str, str],
                    hosts: Sequence[str], w: Workload) -> tuple[dict[str, Any], list[EdgeBudget]]:
    """The budget document and one EdgeBudget per ordered pair of distinct engine hosts."""
    groups: dict[str, list[str]] = {}
    for engine, g in geometries.items():
        groups.setdefault(g.compatibility_hash, []).append(engine)
    per_group: dict[str, kvb.Budget] = {}
    group_docs = []
    for hash_, engines in sorted(groups.items()):
        g = geometries[engines[0]]
        transfer = request_transfer(g, w.prompt_tokens)
        b = kvb.required_gbps(transfer.total_bytes, kv_workload(w))
        per_group[hash_] = b
        group_docs.append({"compatibility_hash": hash_, "engines": sorted(engines),
                           "representative": engines[0], "tensor_parallel_size": g.tp,
                           "block_size": g.block_size, "kv_cache_layout": g.kv_cache_layout,
                           "payload_bytes_per_handoff": b.payload_bytes_per_handoff,
                           "peak_handoffs_per_s": b.peak_handoffs_per_s,
                           "required_gbps": b.required_gbps})
    edges = []
    for src in hosts:
        for dst in hosts:
            if src == dst:
                continue
            consumers = sorted(e for e, h in engine_hosts.items() if h == dst)
            best = max(consumers, key=lambda e: per_group[geometries[e].compatibility_hash]
                       .required_gbps)
            group = geometries[best].compatibility_hash
            edges.append(EdgeBudget(edge_name(src, dst), src, dst,
                                    per_group[group].required_gbps, group, tuple(consumers)))
    doc = stamp(SCHEMA, VERSION, {
        "workload": w.model_dump(), "rule": "required = 8 x payload x max(handoffs_per_s, "
        "burst / transfer_budget_s) x headroom / 1e9, per directed edge, the full rate on each",
        "groups": group_docs,
        "edges": {e.edge: {"required_gbps": e.required_gbps, "group": e.group,
                           "consumers": list(e.consumers)} for e in edges}})
    return doc, edges

