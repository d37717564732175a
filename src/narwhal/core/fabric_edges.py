"""Gate D's documents as strict models: the budget (budget.json), the link records
(links.json), each edge's sample and diagnosis (edge-<a>-to-<b>.json and .diagnosis.json) and
the edge matrix (edges.json).

Gate D holds every document to its model before writing it, and its readers (the gate's own
sample reuse, `narwhal status`'s moved-link check) read them back through the same models,
so a misspelt or missing key fails where it is written, not in a reader later. A document is
written as built, not as the model would dump it: its keys and numbers are the bytes Gate D
has always written (a dump would turn a whole 10 into 10.0). Parts that are other tools'
answers quoted as they came (an engine's idle proof, iperf3's report, a host's UCX
environment, the tool's test parameters) stay JSON values here.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, ValidationError

from narwhal.core.document_io import StrictModel, problems_from, validate_document
from narwhal.core.errors import InputError, Problem

BUDGET_SCHEMA = "narwhal.fabric-budget"
EDGES_SCHEMA = "narwhal.fabric-edges"
VERSION = 1
REFERENCE = "docs/fabric.md"
FIX_OBJECT = "run `narwhal fabric` again (the gate writes this document)"
FIX_VERSION = "run `narwhal fabric` again with this revision"
Verdict = Literal["pass", "fail", "void"]


class BudgetWorkload(StrictModel):
    """The operator's workload the budget was computed from (NARWHAL_WORKLOAD_*)."""

    prompt_tokens: int
    handoffs_per_s: float
    burst: int
    transfer_budget_ms: float
    headroom: float


class BudgetGroup(StrictModel):
    """One cache-equivalence group: engines of one compatibility hash, one payload."""

    compatibility_hash: str
    engines: list[str]
    representative: str
    tensor_parallel_size: int
    block_size: int
    kv_cache_layout: str
    payload_bytes_per_handoff: int
    peak_handoffs_per_s: float
    required_gbps: float


class BudgetEdge(StrictModel):
    required_gbps: float
    group: str  # the consumer group whose budget is the edge's
    consumers: list[str]


class FabricBudget(StrictModel):
    """`narwhal.fabric-budget` v1 (budget.json): what each directed edge must carry."""

    schema_: Literal["narwhal.fabric-budget"] = Field(alias="schema")
    schema_version: Literal[1]
    workload: BudgetWorkload
    rule: str
    groups: list[BudgetGroup]
    edges: dict[str, BudgetEdge]  # "a->b" -> its budget


class LinkInterface(StrictModel):
    name: str
    addresses: list[str]
    mtu: int | None
    up: bool


class LinkRoute(StrictModel):
    dev: str
    source: str | None
    gateway: str | None


class FabricLink(StrictModel):
    """One directed edge's link record (a value of links.json) and its fingerprint."""

    edge: str
    source: str
    destination: str
    source_address: str
    destination_address: str
    source_interface: LinkInterface
    destination_interface: LinkInterface
    route: LinkRoute
    reverse_route: LinkRoute
    transport: dict[str, Any]  # each end's transport settings and UCX environment
    tool_version: str
    test_parameters: dict[str, Any]  # the tool's own (iperf3 and ib_write_bw differ)
    host_keys: dict[str, str]
    fingerprint: str

    def record(self) -> dict[str, Any]:
        """The link record as Gate D wrote it, without its fingerprint."""
        return self.model_dump(exclude={"fingerprint"})


class EdgeSample(StrictModel):
    """edge-<a>-to-<b>.json: one sample of an edge, with the idle proofs around it."""

    edge: str
    link_fingerprint: str
    required_gbps: float
    measured_gbps: float | None
    verdict: Verdict
    idle_proof: dict[str, Any]  # {"before": ..., "after": ...}, or {} when not measured
    client_report: Any  # the client's JSON report, or the tail of its text


class DiagnosisCause(StrictModel):
    cause: str
    found: str
    fix: str


class EdgeDiagnosis(StrictModel):
    """edge-<a>-to-<b>.diagnosis.json: why an edge missed, read from measured facts."""

    edge: str
    sample: str | None
    causes: list[DiagnosisCause]


class EdgeRecord(StrictModel):
    """One row of the edge matrix."""

    edge: str
    source: str
    destination: str
    required_gbps: float
    measured_gbps: float | None
    margin: float | None  # measured / required
    verdict: Verdict
    fingerprint: str
    measured_in: str  # the attempt whose sample this is (this one, or the one reused)
    reused: bool
    sample: str | None  # the artifact name in measured_in
    diagnosis: str | None  # the artifact name in measured_in, for a failing edge
    causes: list[str]


class FabricEdges(StrictModel):
    """`narwhal.fabric-edges` v1 (edges.json): the edge matrix."""

    schema_: Literal["narwhal.fabric-edges"] = Field(alias="schema")
    schema_version: Literal[1]
    hosts: list[str]
    edges: list[EdgeRecord]


def _hold(model: type[StrictModel], doc: Any, source: str) -> None:
    """Refuse `doc` unless `model` accepts it (InputError naming each field)."""
    try:
        model.model_validate_json(json.dumps(doc))
    except ValidationError as exc:
        raise InputError(source, problems_from(exc, model, reference=REFERENCE)) from None


def checked_budget(doc: dict[str, Any]) -> dict[str, Any]:
    """budget.json as built, held to FabricBudget."""
    _hold(FabricBudget, doc, "budget.json (Gate D)")
    return doc


def checked_edges(doc: dict[str, Any]) -> dict[str, Any]:
    """edges.json as built, held to FabricEdges."""
    _hold(FabricEdges, doc, "edges.json (Gate D)")
    return doc


def checked_sample(doc: dict[str, Any], name: str) -> dict[str, Any]:
    """An edge's sample as built, held to EdgeSample."""
    _hold(EdgeSample, doc, f"{name} (Gate D)")
    return doc


def checked_diagnosis(doc: dict[str, Any], name: str) -> dict[str, Any]:
    """An edge's diagnosis as built, held to EdgeDiagnosis."""
    _hold(EdgeDiagnosis, doc, f"{name} (Gate D)")
    return doc


def checked_links(doc: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """links.json as built: each edge's record held to FabricLink."""
    parse_links(doc, "links.json (Gate D)")
    return doc


def parse_edges(raw: Any, source: str) -> FabricEdges:
    """edges.json as Gate D wrote it (InputError naming each field that is not)."""
    return validate_document(raw, source, FabricEdges, EDGES_SCHEMA, VERSION, FIX_OBJECT,
                             FIX_VERSION, reference=REFERENCE)


def parse_links(raw: Any, source: str) -> dict[str, FabricLink]:
    """links.json (edge -> link record) as Gate D wrote it; every problem named by edge."""
    if not isinstance(raw, dict):
        raise InputError(source, [Problem("(document)", "is not a JSON object", FIX_OBJECT)])
    out: dict[str, FabricLink] = {}
    problems: list[Problem] = []
    for edge, record in raw.items():
        try:
            out[edge] = FabricLink.model_validate_json(json.dumps(record))
        except ValidationError as exc:
            problems += problems_from(exc, FabricLink, reference=REFERENCE, at=(edge,))
    if problems:
        raise InputError(source, problems)
    return out
