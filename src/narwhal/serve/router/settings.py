"""Settle the fleet document and the environment once, into frozen values the request path reads.

Everything a request needs that does not depend on the request is computed here at startup:
engine addresses, pre-encoded request-line prefixes, the tenant key table, resolved journal
path, the engines' API key as the header every leg carries. A missing tenant key variable or
an unreadable key file stops startup naming it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from narwhal.core.errors import InputError, Problem
from narwhal.core.fleet import (
    EngineContract,
    FleetDocument,
    RoleFlips,
    Serving,
    beside,
    engine_key,
)
from narwhal.core.key_file import read_key_file
from narwhal.core.kv_canary import load_canary
from narwhal.core.secret import Secret
from narwhal.serve.router.canary.judge import Reference


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One engine as the router addresses it."""

    id: str
    url: str
    host: str
    port: int
    role: str
    can_prefill: bool
    can_decode: bool
    host_header: bytes
    bearer: bytes = b""  # the engines' API key (fleet: engine_auth), sent on every leg


@dataclass(frozen=True, slots=True)
class Limits:
    """Named limits and timeouts (seconds)."""

    max_request_bytes: int
    max_concurrent: int
    connect_timeout_s: float
    prefill_timeout_s: float
    first_token_timeout_s: float
    stream_idle_timeout_s: float
    drain_timeout_s: float
    upstream_keepalive_s: float
    tokenize: bool
    stall_steps: int = 50
    stall_floor_s: float = 2.0
    continue_midstream: bool = True
    slo_tpot_s: float = 0.0  # the fleet's TPOT objective: the step a stall is counted in
    # when placement predicted none
    deadline_factor: float = 4.0  # a leg's deadline: this many of its predicted durations
    deadline_floor_s: float = 5.0
    handoff_budget_s: float = 0.0  # Gate D's budget for one handoff (0: none known)


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """What one client connection may make the router hold (front.py, connections.py)."""

    max_request_line_bytes: int
    max_header_bytes: int
    max_header_count: int
    max_body_bytes: int
    max_connections: int
    client_connection_share: float
    header_timeout_s: float
    body_timeout_s: float
    idle_timeout_s: float

    @property
    def per_client(self) -> int:
        """Connections one peer address may hold before its own idlest one makes room."""
        return max(1, int(self.max_connections * self.client_connection_share))


@dataclass(frozen=True, slots=True)
class OpsAccess:
    """Who may read /metrics, /narwhal/state and /narwhal/handoff (fleet: operations)."""

    open: bool
    key_digest: bytes  # sha256 of the operator key; empty when none is configured
    secret: Secret | None

    def allows(self, authorization: bytes) -> bool:
        if self.open:
            return True
        scheme, _, token = authorization.partition(b" ")
        return bool(self.key_digest) and scheme.lower() == b"bearer" and \
            hashlib.sha256(token.strip()).digest() == self.key_digest


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    eject_after_failures: int
    probe_interval_s: float
    probe_timeout_s: float


@dataclass(frozen=True, slots=True)
class Tenants:
    """Bearer-key table: sha256(key) -> tenant name. Empty means no authentication."""

    by_key_digest: Mapping[bytes, str]
    secrets: tuple[Secret, ...]
    weights: Mapping[str, float] = field(default_factory=dict)  # fair-share weight by name

    @property
    def required(self) -> bool:
        return bool(self.by_key_digest)

    def tenant_for(self, bearer: bytes) -> str | None:
        """The tenant whose key this is; hashing first keeps lookup time independent of the key."""
        return self.by_key_digest.get(hashlib.sha256(bearer).digest())


@dataclass(frozen=True, slots=True)
class QuorumPolicy:
    """The sidecars whose majority grants the lease, and the key they were started with."""

    deployment: str
    lease_urls: tuple[str, ...]
    key_file: Path
    key: Secret


@dataclass(frozen=True, slots=True)
class ControllerPolicy:
    """Where the controller lease lives and how fast it turns over (seconds)."""

    lease_path: Path
    lease_ttl_s: float
    handoff_poll_s: float
    quorum: QuorumPolicy | None = None  # None: the lease file at lease_path

    @property
    def backend(self) -> str:
        """What holds the lease, in the words /narwhal/state and errors use."""
        return "file" if self.quorum is None else f"quorum of {len(self.quorum.lease_urls)} sidecars"

    @property
    def where(self) -> str:
        """Where an operator looks for the lease: the file, or the sidecars' lease routes."""
        if self.quorum is None:
            return f"lease file {self.lease_path}"
        return f"lease held by a {self.backend}: {', '.join(self.quorum.lease_urls)}"

    @property
    def renew_every_s(self) -> float:
        """Renew four times per lease period: two renewals may fail before the lease lapses."""
        return self.lease_ttl_s / 4


@dataclass(frozen=True, slots=True)
class CacheSettings:
    """The fleet's prefix_cache section, resolved: the tokenizer folder, the blocks assumed for
    engines without events (0: read from the engine), and each engine's event endpoint."""

    tokenizer_dir: Path
    approximate_blocks: int
    events: Mapping[str, tuple[str, str]]  # engine id -> (endpoint, topic)
    off_loop_tokens: int  # prompts estimated this long are tokenized on a worker thread


@dataclass(frozen=True, slots=True)
class RouterSettings:
    model: str
    engines: tuple[EngineSpec, ...]
    ttft_s: float
    tpot_s: float
    limits: Limits
    clients: ClientLimits
    health: HealthPolicy
    tenants: Tenants
    journal_path: Path
    journal_max_rows: int
    controller: ControllerPolicy
    profiles_path: Path | None
    role_flips: RoleFlips | None = None  # the reactive role controller's policy (roles.py)
    ops: OpsAccess = OpsAccess(True, b"", None)
    # engine id -> (its sidecar's /v1/attestation URL, the contract Gate E attested)
    attestations: Mapping[str, tuple[str, EngineContract]] = field(default_factory=dict)
    cache: CacheSettings | None = None  # cache-aware placement (router/cache/)
    canary: CanarySettings | None = None  # the live KV canary (router/canary/)


@dataclass(frozen=True, slots=True)
class CanarySettings:
    """The canary's reference answer and how often each pair is probed."""

    reference: Reference
    interval_s: float
    release_after: int
    logprob_tolerance: float


def _canary(doc: FleetDocument, fleet_path: Path) -> CanarySettings | None:
    """The fleet's kv_canary, its reference read and checked against the fleet's model."""
    ref = doc.kv_canary
    if ref is None:
        return None
    path = beside(fleet_path, ref.path)
    canary = load_canary(path)
    if canary.model != doc.model:
        raise InputError(str(fleet_path), [Problem(
            "kv_canary.path", f"{path} was recorded for model {canary.model!r}, the fleet serves "
            f"{doc.model!r}", "re-run narwhal-check --calibrate-first-token on this fleet")])
    return CanarySettings(Reference(canary.prompt, canary.prompt_tokens, canary.max_tokens,
                                    canary.text, canary.token_logprobs),
                          ref.interval_s, ref.release_after, ref.logprob_tolerance)


def _engine(entry_id: str, url: str, role: str, key: Secret | None = None) -> EngineSpec:
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or 80
    return EngineSpec(
        id=entry_id,
        url=url.rstrip("/"),
        host=host,
        port=port,
        role=role,
        can_prefill=role in ("prefill", "both"),
        can_decode=role in ("decode", "both"),
        host_header=f"{host}:{port}".encode("ascii"),
        bearer=key.reveal().encode("ascii") if key is not None else b"",
    )


def _tenant_key(i: int, key_env: str, key_file: str, env: Mapping[str, str],
                fleet_path: Path) -> tuple[str, str] | Problem:
    """(key, where it came from) of tenant i: its 0600 file or its variable."""
    if key_file.strip():
        secret = read_key_file(beside(fleet_path, key_file), f"tenants[{i}].key_file")
        return secret.reveal(), f"tenants[{i}].key_file"
    value = env.get(key_env, "")
    if not value:
        return Problem(f"tenants[{i}].key_env",
                       f"environment variable {key_env} is not set or empty",
                       f"export {key_env}=<the tenant's bearer key> before starting narwhal-serve")
    if len(value) < 16:
        return Problem(f"tenants[{i}].key_env",
                       f"the key in {key_env} is shorter than 16 characters",
                       "use a long random key, e.g. `openssl rand -hex 24`")
    return value, key_env


def _tenants(doc: FleetDocument, env: Mapping[str, str], fleet_path: Path) -> Tenants:
    table: dict[bytes, str] = {}
    secrets: list[Secret] = []
    problems: list[Problem] = []
    for i, tenant in enumerate(doc.tenants):
        got = _tenant_key(i, tenant.key_env, tenant.key_file, env, fleet_path)
        if isinstance(got, Problem):
            problems.append(got)
            continue
        value, where = got
        digest = hashlib.sha256(value.encode()).digest()
        if digest in table:
            problems.append(Problem(
                where, f"holds the same key as tenant {table[digest]!r}",
                "give every tenant its own key"))
            continue
        table[digest] = tenant.name
        secrets.append(Secret(value, tenant.key_env or f"tenant {tenant.name} key"))
    if problems:
        raise InputError(str(fleet_path), problems)
    return Tenants(by_key_digest=table, secrets=tuple(secrets),
                   weights={t.name: t.weight for t in doc.tenants})


def _same_names(cls: type, serving: Serving, **derived: Any) -> dict[str, Any]:
    """A settled dataclass's fields copied from `serving` by name, plus the derived ones."""
    names = [f.name for f in fields(cls) if f.name not in derived]
    return {**{n: getattr(serving, n) for n in names}, **derived}


def _ops(doc: FleetDocument, env: Mapping[str, str], fleet_path: Path,
         tenants: Tenants) -> OpsAccess:
    ops = doc.operations
    source = str(fleet_path)
    if ops.key_file.strip():
        secret = read_key_file(beside(fleet_path, ops.key_file), "operations.key_file")
        value, where = secret.reveal(), "operations.key_file"
    elif ops.key_env:
        value, where = env.get(ops.key_env, ""), "operations.key_env"
        if len(value) < 16:
            raise InputError(source, [Problem(
                where, f"environment variable {ops.key_env} is not set or holds "
                "fewer than 16 characters",
                f"export {ops.key_env}=<a long random key, e.g. `openssl rand -hex 24`>")])
    else:
        # No operator key: with no tenant keys nobody is authenticated, so these are as open
        # as the rest.
        return OpsAccess(ops.open or not tenants.required, b"", None)
    digest = hashlib.sha256(value.encode()).digest()
    if digest in tenants.by_key_digest:
        raise InputError(source, [Problem(
            where, "holds a tenant's key", "give the operator a key of its own")])
    return OpsAccess(False, digest, Secret(value, ops.key_env or "operator key"))


def _quorum(doc: FleetDocument, fleet_path: Path) -> QuorumPolicy | None:
    """The quorum section with its key read now: a missing or open key file stops startup."""
    q = doc.controller.quorum
    if q is None:
        return None
    key_file = beside(fleet_path, q.key_file)
    return QuorumPolicy(q.deployment, tuple(u.rstrip("/") for u in q.lease_urls), key_file,
                        read_key_file(key_file, "controller.quorum.key_file"))


def settle(doc: FleetDocument, env: Mapping[str, str], fleet_path: Path) -> RouterSettings:
    """Resolve the document against the environment and the document's own folder."""
    journal = beside(fleet_path, doc.journal.path)
    c = doc.controller
    lease = beside(fleet_path, c.lease_path) if c.lease_path.strip() \
        else fleet_path.resolve().with_name(fleet_path.name + ".lease")
    profiles = beside(fleet_path, doc.profiles.path) if doc.profiles is not None else None
    s = doc.serving
    tenants = _tenants(doc, env, fleet_path)
    key = engine_key(doc, fleet_path)
    return RouterSettings(
        model=doc.model,
        engines=tuple(_engine(e.id, e.url, e.role, key) for e in doc.engines),
        ttft_s=doc.slo.ttft_s,
        tpot_s=doc.slo.tpot_s,
        limits=Limits(**_same_names(Limits, s, tokenize=s.prompt_length == "tokenize",
                                    slo_tpot_s=doc.slo.tpot_s,
                                    handoff_budget_s=s.handoff_budget_s or 0.0)),
        clients=ClientLimits(**_same_names(ClientLimits, s, max_body_bytes=s.max_request_bytes)),
        health=HealthPolicy(
            eject_after_failures=doc.health.eject_after_failures,
            probe_interval_s=doc.health.probe_interval_s,
            probe_timeout_s=doc.health.probe_timeout_s,
        ),
        tenants=tenants,
        journal_path=journal,
        journal_max_rows=doc.journal.max_queued_rows,
        controller=ControllerPolicy(lease, c.lease_ttl_s, c.handoff_poll_s,
                                    _quorum(doc, fleet_path)),
        profiles_path=profiles,
        role_flips=doc.role_flips,
        ops=_ops(doc, env, fleet_path, tenants),
        attestations={e.id: (e.attestation_url, e.contract) for e in doc.engines
                      if e.attestation_url is not None and e.contract is not None},
        cache=None if doc.prefix_cache is None else CacheSettings(
            beside(fleet_path, doc.prefix_cache.tokenizer_dir),
            doc.prefix_cache.approximate_blocks,
            {e.id: (e.kv_events.endpoint, e.kv_events.topic) for e in doc.engines
             if e.kv_events is not None}, doc.prefix_cache.off_loop_tokens),
        canary=_canary(doc, fleet_path),
    )
