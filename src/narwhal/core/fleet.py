"""The fleet document (`narwhal.fleet` v1): what the router serves, on which engines, under which SLO.

The document is strict and closed: an unknown key is refused rather than ignored, because a typo
(`max_concurent`) would otherwise fall back to a default without a word. Every problem in one
document is reported at once, each naming the dotted field and the way out (document_io.py).
Bearer keys never appear here: a tenant names the environment variable or the private (0600)
file that holds its key, and the engines' own API key is named by its file (`engine_auth`).

It lives in core/ because every role reads it: deploy writes it, the router serves it, and
narwhal-profile and narwhal-check read it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field

from narwhal.core.document_io import StrictModel, read_json_document, validate_document
from narwhal.core.errors import InputError, Problem
from narwhal.core.key_file import read_key_file
from narwhal.core.kv_canary import LOGPROB_TOLERANCE
from narwhal.core.secret import Secret

SCHEMA = "narwhal.fleet"
# Fields the deploy side writes from the `.env`, whose reader keeps to the same bounds so a
# value it accepts is one the router accepts.
KV_CANARY_INTERVAL_S = 60.0  # kv_canary.interval_s's default
KV_CANARY_INTERVAL_RANGE_S = (0.1, 86_400.0)
HANDOFF_BUDGET_MAX_S = 3600.0  # serving.handoff_budget_s's bound
VERSION = 1
REFERENCE = "docs/router.md"  # where the fields are described
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class EngineContract(StrictModel):
    """What Gate E attested for an engine: the live engine is held to it."""

    compatibility_hash: str = Field(min_length=1, max_length=128)
    launch_record_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    attestation_digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")


class KvEvents(StrictModel):
    """Where an engine publishes vLLM's KV cache events: its --kv-events-config endpoint as
    the router reaches it (tcp://HOST:PORT) and the topic it publishes on."""

    endpoint: str = Field(min_length=1, max_length=256)
    topic: str = Field(default="", max_length=256)


class EngineEntry(StrictModel):
    """One engine: a stable id, its OpenAI-compatible base URL and the legs it may serve;
    after Gate E, its attestation sidecar's URL and the contract it attested."""

    id: str
    url: str
    role: Literal["prefill", "decode", "both"]
    attestation_url: str | None = None  # http://HOST:PORT/v1/attestation
    contract: EngineContract | None = None
    kv_events: KvEvents | None = None  # absent: the router follows its routing history


class PrefixCache(StrictModel):
    """Cache-aware placement (docs/router.md, "Placing on engine cache state"): the folder
    holding the model's tokenizer.json (and tokenizer_config.json) on the router host, and
    the blocks the router assumes an engine without KV events holds (0: the engine's own
    num_gpu_blocks, read from its vllm:cache_config_info), and from how many estimated prompt
    tokens a prompt is tokenized on a worker thread instead of the event loop (0: every one)."""

    tokenizer_dir: str = Field(min_length=1, max_length=4096)
    approximate_blocks: int = Field(default=0, ge=0, le=1 << 30)
    off_loop_tokens: int = Field(default=2048, ge=0, le=1 << 24)


class Slo(StrictModel):
    """Service-level objectives; histogram buckets are derived from them."""

    ttft_s: float = Field(gt=0, le=600)
    tpot_s: float = Field(gt=0, le=60)


class Serving(StrictModel):
    """Named limits and timeouts; every value has a default that suits a small fleet."""

    max_request_bytes: int = Field(default=1_048_576, ge=1024, le=256 * 1_048_576)
    max_concurrent: int = Field(default=1024, ge=1, le=100_000)
    connect_timeout_s: float = Field(default=2.0, gt=0, le=60)
    prefill_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    first_token_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    stream_idle_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    # A stream is stalled after this many of its predicted steps without a byte (the profile's
    # TPOT at its engine's load, else slo.tpot_s), never sooner than the floor nor later than
    # stream_idle_timeout_s; a stalled or broken stream is continued on another engine
    # (docs/router.md "Continuing a broken stream") unless continue_midstream is false.
    stall_steps: int = Field(default=50, ge=1, le=100_000)
    stall_floor_s: float = Field(default=2.0, gt=0, le=3600)
    continue_midstream: bool = True
    # A leg's first byte is awaited for what it carries (docs/router.md "Deadlines"): a prefill
    # `deadline_factor` times the TTFT placement predicted for it (never under
    # `deadline_floor_s`); a decode leg that pulls KV over a pair that has handed off before,
    # the handoff budget Gate D proved every edge meets plus the stall allowance; the fixed
    # timeouts above are the caps, and what a leg gets when nothing predicted it.
    deadline_factor: float = Field(default=4.0, ge=1, le=100)
    deadline_floor_s: float = Field(default=5.0, gt=0, le=3600)
    handoff_budget_s: float | None = Field(default=None, gt=0, le=HANDOFF_BUDGET_MAX_S)
    drain_timeout_s: float = Field(default=30.0, ge=0, le=3600)
    upstream_keepalive_s: float = Field(default=4.0, gt=0, le=3600)
    prompt_length: Literal["prefill_usage", "tokenize"] = "prefill_usage"
    # What one client may make the router hold (docs/security.md): every limit below is
    # enforced before the router allocates anything that grows with what the client sends.
    max_request_line_bytes: int = Field(default=8192, ge=256, le=1_048_576)
    max_header_bytes: int = Field(default=32_768, ge=1024, le=1_048_576)
    max_header_count: int = Field(default=100, ge=8, le=10_000)
    max_connections: int = Field(default=4096, ge=16, le=1_000_000)
    client_connection_share: float = Field(default=0.5, gt=0, le=1)
    header_timeout_s: float = Field(default=10.0, gt=0, le=600)
    body_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    idle_timeout_s: float = Field(default=60.0, gt=0, le=3600)


class Operations(StrictModel):
    """Who may read the operational endpoints (/metrics, /narwhal/state, /narwhal/handoff).

    With no tenant keys the router authenticates nobody and these are open like the rest.
    With tenant keys they are closed by default: they name engines, tenants, queue depths and
    the lease holder. `key_env` names the variable holding the operator's bearer key (the
    standby and Prometheus send it); `open: true` serves them without a key, for a router
    whose port only a private monitoring network reaches. /health and /ready stay open.
    """

    key_env: str = ""
    key_file: str = Field(default="", max_length=4096)
    open: bool = False


class Health(StrictModel):
    """When an engine is ejected and how often ejected or idle engines are probed."""

    eject_after_failures: int = Field(default=3, ge=1, le=1000)
    probe_interval_s: float = Field(default=2.0, gt=0, le=3600)
    probe_timeout_s: float = Field(default=1.0, gt=0, le=60)


class Tenant(StrictModel):
    """A tenant and where its bearer key is (never the key): an environment variable
    (`key_env`) or a private file (`key_file`, what `narwhal deploy` writes: the router host
    gets the key as a 0600 file, never in argv or the record). Exactly one of the two.

    `weight` is its fair share of the fleet relative to the other tenants with requests in
    flight; it matters only when the fleet is near capacity (serve/router/scheduling/scheduler.py)."""

    name: str
    key_env: str = ""
    key_file: str = Field(default="", max_length=4096)
    weight: float = Field(default=1.0, gt=0, le=1000)

    @classmethod
    def unknown_key_fix(cls, key: str) -> str | None:
        if "key" not in key.lower():
            return None
        return ("never put a key in the document: export it in an environment variable "
                "and write that variable's name in key_env, or name its 0600 file in key_file")


class EngineAuth(StrictModel):
    """The engines' API key (vLLM's VLLM_API_KEY), named by its private (0600) file: the
    router, narwhal-profile and narwhal-check send it on every call to an engine."""

    key_file: str = Field(min_length=1, max_length=4096)


class Journal(StrictModel):
    """Where per-request rows go and how many may wait for the writer before rows are dropped."""

    path: str
    max_queued_rows: int = Field(default=65_536, ge=16, le=10_000_000)


QUORUM_MEMBERS_MAX = 15  # sidecars a lease asks: more adds round trips, not survivable failures


class Quorum(StrictModel):
    """The controller lease granted by a majority of the attestation sidecars (Gate E).

    `lease_urls` are the sidecars' lease routes (`http://HOST:PORT/v1/lease`, one per sidecar
    started with `--lease-key-file`), `key_file` the private file holding the key those
    sidecars were started with (relative paths are taken from the document's folder), and
    `deployment` the name the sidecars were started with (`--deployment`): a sidecar of
    another deployment refuses. See docs/controller-lease.md.
    """

    deployment: str = Field(min_length=1, max_length=128)
    lease_urls: tuple[str, ...] = Field(min_length=3, max_length=QUORUM_MEMBERS_MAX)
    key_file: str = Field(min_length=1, max_length=4096)


class Controller(StrictModel):
    """The controller lease: exactly one router places requests for this fleet.

    Without `quorum`, the lease is a file: `lease_path` defaults to `<fleet document>.lease`
    beside the document, so two routers started on the same document contend for the same
    lease. With `quorum`, a strict majority of the sidecars grants it instead. A standby takes
    over at most `lease_ttl_s` (plus one `handoff_poll_s`) after the primary dies.
    """

    lease_path: str = ""
    lease_ttl_s: float = Field(default=1.0, ge=0.2, le=60)
    handoff_poll_s: float = Field(default=0.1, ge=0.02, le=10)
    quorum: Quorum | None = None


class Profiles(StrictModel):
    """Where the `narwhal.profiles` store is (written by narwhal-profile)."""

    path: str


class CalibrationRef(StrictModel):
    """Where the `narwhal.first-token-calibration` document is (narwhal-check writes it).

    With it, the router refuses to start when serving.first_token_timeout_s is below the
    calibrated candidate deadline (serve/router/calibrated_deadline.py).
    """

    path: str


class RoleFlips(StrictModel):
    """The reactive role controller over the `both` engines (serve/router/scheduling/roles.py).

    Every `interval_s` it compares SLO-relative prefill load (predicted queue wait over the
    TTFT budget) with decode load (predicted step time over the TPOT budget) and moves one
    engine from the lighter pool to the heavier when the heavier is above `high_water` and the
    lighter below `low_water`; an engine that flipped waits `cooldown_s` before it may flip
    again. The gap between the marks and the cooldown are the hysteresis that stops flapping.
    """

    interval_s: float = Field(default=0.5, ge=0.05, le=60)
    high_water: float = Field(default=0.8, gt=0, le=100)
    low_water: float = Field(default=0.4, ge=0, le=100)
    cooldown_s: float = Field(default=5.0, ge=0, le=3600)
    min_prefill: int = Field(default=1, ge=0, le=1024)
    min_decode: int = Field(default=1, ge=0, le=1024)
    # `planner` (serve/router/scheduling/planner.py) sizes both pools from the demand of the last `window_s` seconds
    # instead of reacting to the marks; the two utilizations are the targets it sizes for.
    mode: Literal["reactive", "planner"] = "reactive"
    window_s: float = Field(default=4.0, ge=0.2, le=3600)
    prefill_utilization: float = Field(default=0.7, gt=0, le=1)
    decode_utilization: float = Field(default=0.8, gt=0, le=1)


class KvCanaryRef(StrictModel):
    """The live KV canary: where its reference is (`narwhal.kv-canary`, narwhal-check writes
    it at preflight) and how often each ordered pair is probed (serve/router/canary/)."""

    path: str
    interval_s: float = Field(default=KV_CANARY_INTERVAL_S, ge=KV_CANARY_INTERVAL_RANGE_S[0],
                              le=KV_CANARY_INTERVAL_RANGE_S[1])  # each pair once per interval
    release_after: int = Field(default=3, ge=1, le=1000)  # passes in a row that free a pair
    logprob_tolerance: float = Field(default=LOGPROB_TOLERANCE, ge=0, le=10)


class FleetDocument(StrictModel):
    """`narwhal.fleet` v1."""

    schema_: Literal["narwhal.fleet"] = Field(alias="schema")
    schema_version: Literal[1]
    model: str = Field(min_length=1, max_length=256)
    engines: tuple[EngineEntry, ...] = Field(min_length=1, max_length=1024)
    slo: Slo
    serving: Serving = Serving()
    health: Health = Health()
    tenants: tuple[Tenant, ...] = ()
    engine_auth: EngineAuth | None = None
    journal: Journal
    controller: Controller = Controller()
    profiles: Profiles | None = None
    role_flips: RoleFlips | None = None
    calibration: CalibrationRef | None = None
    operations: Operations = Operations()
    prefix_cache: PrefixCache | None = None  # absent: placement is blind to engine caches
    kv_canary: KvCanaryRef | None = None  # absent: no live probes of the pairs


def _url_problem(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme != "http":
        return "must start with http:// (the router speaks plain HTTP/1.1 to engines)"
    if not parts.hostname or parts.port is None:
        return "must name a host and an explicit port, e.g. http://10.0.0.5:8000"
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return "must be a bare base URL without path, query or credentials"
    return ""


def _events_endpoint_problem(endpoint: str) -> str:
    """A router connects to an engine's event publisher over TCP, to one host and port."""
    if not endpoint.startswith("tcp://"):
        return "must start with tcp:// (the router subscribes over TCP)"
    parts = urlsplit(endpoint)
    try:
        port = parts.port
    except ValueError:
        return "has a port that is not a number in 1-65535"
    if not parts.hostname or port is None or parts.hostname == "*":
        return "must name the engine's host and port (the router connects; it does not bind)"
    if parts.path or parts.query or parts.fragment or parts.username:
        return "must be tcp://HOST:PORT without path, query or credentials"
    return ""


def _attestation_url_problem(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http(s) URL with a host"
    if parts.path != "/v1/attestation" or parts.query or parts.fragment or parts.username:
        return "must end in /v1/attestation, without query or credentials"
    return ""


def _lease_url_problem(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http(s) URL with a host"
    if parts.path != "/v1/lease" or parts.query or parts.fragment or parts.username:
        return "must end in /v1/lease (the sidecar's lease route), without query or credentials"
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number in range
    except ValueError:
        return "has a port that is not a number in 1-65535"
    return ""


def _sidecar_key(url: str) -> str:
    """host:port of a lease URL, default ports made explicit, so repeats are found."""
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return url
    return f"{(parts.hostname or '').lower()}:{port}"


def _quorum_problems(c: Controller) -> list[Problem]:
    q = c.quorum
    if q is None:
        return []
    problems: list[Problem] = []
    if c.lease_path.strip():
        problems.append(Problem("controller.lease_path", "is set while controller.quorum is",
                                "choose one: a lease file, or the quorum of sidecars"))
    seen: dict[str, int] = {}
    for i, url in enumerate(q.lease_urls):
        why = _lease_url_problem(url)
        if why:
            problems.append(Problem(f"controller.quorum.lease_urls[{i}]", f"{url!r} {why}",
                                    "write http://SIDECAR:PORT/v1/lease"))
        key = _sidecar_key(url)
        if key in seen:
            problems.append(Problem(f"controller.quorum.lease_urls[{i}]",
                                    f"names the same sidecar as lease_urls[{seen[key]}]",
                                    "list each sidecar once: a repeated one would count twice "
                                    "towards the majority"))
        seen.setdefault(key, i)
    if not q.key_file.strip():
        problems.append(Problem("controller.quorum.key_file", "is empty",
                                "name the private (0600) file holding the controller key"))
    return problems


def _address_problems(where: str, engine: EngineEntry) -> list[Problem]:
    """Where the router reaches one engine: its URL, its sidecar and its event publisher."""
    problems: list[Problem] = []
    why = _url_problem(engine.url)
    if why:
        problems.append(Problem(f"{where}.url", f"{engine.url!r} {why}", "fix the URL"))
    if engine.attestation_url is not None:
        why = _attestation_url_problem(engine.attestation_url)
        if why:
            problems.append(Problem(f"{where}.attestation_url",
                                    f"{engine.attestation_url!r} {why}", "fix the URL"))
    if (engine.attestation_url is None) != (engine.contract is None):
        problems.append(Problem(f"{where}.contract", "an attestation_url and a contract "
                                "come together (Gate E writes both)",
                                "give both, or neither"))
    if engine.kv_events is not None:
        why = _events_endpoint_problem(engine.kv_events.endpoint)
        if why:
            problems.append(Problem(f"{where}.kv_events.endpoint",
                                    f"{engine.kv_events.endpoint!r} {why}",
                                    "write tcp://ENGINE_HOST:PORT, the port of the engine's "
                                    "--kv-events-config endpoint"))
    return problems


def _relations(doc: FleetDocument) -> list[Problem]:
    """Checks between fields that a schema cannot express."""
    problems: list[Problem] = []
    seen_ids: dict[str, int] = {}
    seen_urls: dict[str, int] = {}
    for i, engine in enumerate(doc.engines):
        where = f"engines[{i}]"
        if not _ID.match(engine.id):
            problems.append(Problem(f"{where}.id", f"{engine.id!r} is not a usable id",
                                    "use letters, digits, '.', '_' or '-' (at most 64)"))
        if engine.id in seen_ids:
            problems.append(Problem(f"{where}.id", f"{engine.id!r} repeats engines[{seen_ids[engine.id]}]",
                                    "give every engine its own id"))
        seen_ids.setdefault(engine.id, i)
        problems += _address_problems(where, engine)
        key = engine.url.rstrip("/")
        if key in seen_urls:
            problems.append(Problem(f"{where}.url", f"same URL as engines[{seen_urls[key]}]",
                                    "list each engine once; use role 'both' for an engine that does both legs"))
        seen_urls.setdefault(key, i)
    if not any(e.role in ("prefill", "both") for e in doc.engines):
        problems.append(Problem("engines", "no engine can take a prefill leg",
                                "give at least one engine role 'prefill' or 'both'"))
    if not any(e.role in ("decode", "both") for e in doc.engines):
        problems.append(Problem("engines", "no engine can take a decode leg",
                                "give at least one engine role 'decode' or 'both'"))
    problems += _tenant_problems(doc)
    if doc.profiles is not None and not doc.profiles.path.strip():
        problems.append(Problem("profiles.path", "is empty",
                                "name the narwhal.profiles document, e.g. runs/profiles.json"))
    problems += _cache_problems(doc)

    if doc.kv_canary is not None and not doc.kv_canary.path.strip():
        problems.append(Problem("kv_canary.path", "is empty",
                                "name the narwhal.kv-canary document narwhal-check "
                                "--calibrate-first-token wrote, or remove kv_canary"))
    if doc.calibration is not None and not doc.calibration.path.strip():
        problems.append(Problem("calibration.path", "is empty",
                                "name the narwhal.first-token-calibration document written by "
                                "narwhal-check --calibrate-first-token, or remove the section"))
    problems += _role_flip_problems(doc)
    problems += _limit_problems(doc)
    c = doc.controller
    problems += _quorum_problems(c)
    if c.handoff_poll_s >= c.lease_ttl_s:
        problems.append(Problem("controller.handoff_poll_s",
                                f"{c.handoff_poll_s:g} s is not shorter than lease_ttl_s {c.lease_ttl_s:g} s",
                                "poll the handoff document several times per lease period"))
    if not doc.journal.path.strip():
        problems.append(Problem("journal.path", "is empty", "name the JSONL file, e.g. runs/journal.jsonl"))
    return problems


def _cache_problems(doc: FleetDocument) -> list[Problem]:
    """Cache-aware placement needs a tokenizer folder and curves to price hits on."""
    if doc.prefix_cache is None:
        return []
    problems: list[Problem] = []
    if not doc.prefix_cache.tokenizer_dir.strip():
        problems.append(Problem("prefix_cache.tokenizer_dir", "is empty",
                                "name the folder holding the model's tokenizer.json"))
    if doc.profiles is None:
        problems.append(Problem("prefix_cache", "prices placement on the engines' measured "
                                "curves, and this fleet has none",
                                "add a profiles section (narwhal-profile writes the store), or "
                                "remove prefix_cache"))
    return problems


def _tenant_problems(doc: FleetDocument) -> list[Problem]:
    """Each tenant named once, with exactly one well-formed place for its key."""
    problems: list[Problem] = []
    names: set[str] = set()
    for i, tenant in enumerate(doc.tenants):
        if not _ID.match(tenant.name) or tenant.name in names:
            problems.append(Problem(f"tenants[{i}].name", f"{tenant.name!r} is empty, malformed or repeated",
                                    "give each tenant a distinct name of letters, digits, '.', '_' or '-'"))
        names.add(tenant.name)
        problems += _tenant_key_problems(i, tenant)
    return problems


def _tenant_key_problems(i: int, tenant: Tenant) -> list[Problem]:
    """Exactly one of key_env and key_file, each well formed."""
    where = f"tenants[{i}]"
    if bool(tenant.key_env) == bool(tenant.key_file.strip()):
        return [Problem(f"{where}.key_env", "give exactly one of key_env and key_file",
                        "name the variable that holds the key (key_env) or its 0600 file "
                        "(key_file)")]
    if tenant.key_env and not _ENV_NAME.match(tenant.key_env):
        return [Problem(
            f"{where}.key_env",
            "is not an environment variable name (the document holds the variable's name, never the key)",
            "write the name of the variable that holds the key, e.g. NARWHAL_KEY_TEAM_A")]
    return []


def _limit_problems(doc: FleetDocument) -> list[Problem]:
    s = doc.serving
    problems: list[Problem] = []
    if s.max_request_line_bytes > s.max_header_bytes:
        problems.append(Problem(
            "serving.max_request_line_bytes",
            f"{s.max_request_line_bytes} is above max_header_bytes {s.max_header_bytes} "
            "(the request line is part of the head)", "lower it or raise max_header_bytes"))
    ops = doc.operations
    if ops.key_env and not _ENV_NAME.match(ops.key_env):
        problems.append(Problem(
            "operations.key_env", "is not an environment variable name (the document holds "
            "the variable's name, never the key)", "write e.g. NARWHAL_OPS_KEY"))
    if ops.key_env and ops.key_file.strip():
        problems.append(Problem("operations.key_file", "is set while operations.key_env is",
                                "name the operator key once: a variable or a file"))
    if (ops.key_env or ops.key_file.strip()) and ops.open:
        problems.append(Problem("operations.open", "is true while an operator key is set",
                                "choose one: a key for the operational endpoints, or open"))
    return problems


def _role_flip_problems(doc: FleetDocument) -> list[Problem]:
    flips = doc.role_flips
    if flips is None:
        return []
    problems: list[Problem] = []
    both = sum(1 for e in doc.engines if e.role == "both")
    if doc.profiles is None:
        problems.append(Problem("role_flips", "needs measured curves to price both pools' load",
                                "add a profiles section (narwhal-profile writes the store)"))
    if both < 2:
        problems.append(Problem("role_flips", f"{both} engine(s) have role 'both'; flips need two",
                                "give at least two engines role 'both' or remove role_flips"))
    elif flips.min_prefill + flips.min_decode > both:
        problems.append(Problem(
            "role_flips.min_prefill",
            f"min_prefill {flips.min_prefill} + min_decode {flips.min_decode} exceed the {both} "
            "'both' engines", "lower the floors so both pools can be filled"))
    for leg, floor in (("prefill", flips.min_prefill), ("decode", flips.min_decode)):
        if floor == 0 and not any(e.role == leg for e in doc.engines):
            problems.append(Problem(f"role_flips.min_{leg}",
                                    f"is 0 and no engine has role '{leg}', so the {leg} pool could empty",
                                    "raise it to 1 or add an engine with that fixed role"))
    if flips.low_water >= flips.high_water:
        problems.append(Problem("role_flips.low_water",
                                f"{flips.low_water:g} is not below high_water {flips.high_water:g}",
                                "keep a gap between the marks (e.g. 0.4 and 0.8) so roles do not flap"))
    if flips.window_s < 2 * flips.interval_s:
        problems.append(Problem("role_flips.window_s",
                                f"{flips.window_s:g} s holds fewer than two ticks of interval_s "
                                f"{flips.interval_s:g} s", "make the window at least two intervals long"))
    return problems


def parse_fleet(raw: Any, source: str) -> FleetDocument:
    """Validate an already-parsed JSON value; raise InputError listing every problem."""
    doc = validate_document(raw, source, FleetDocument, SCHEMA, VERSION,
                            f"write a {SCHEMA} v{VERSION} object",
                            f"write schema_version {VERSION}", reference=REFERENCE)
    problems = _relations(doc)
    if problems:
        raise InputError(source, problems)
    return doc


def checked_fleet(doc: dict[str, Any], source: str) -> dict[str, Any]:
    """A fleet document deploy is about to write, held to FleetDocument (every field and the
    relations between them) so a fleet the router would refuse is refused where it is made,
    naming each field, before a byte of it is written (InputError, as for any document).

    The dict comes back as built, not as the model would dump it: its keys and numbers are
    the bytes deploy has always written (a dump would add every default and turn 10 into 10.0).
    """
    parse_fleet(doc, source)
    return doc


def beside(fleet_path: Path, text: str) -> Path:
    """A path the fleet document names (journal, lease, profiles, calibration): relative ones
    are taken from the document's folder, so every tool resolves them as the router does."""
    path = Path(text)
    return path if path.is_absolute() else fleet_path.resolve().parent / path


def engine_key(doc: FleetDocument, fleet_path: Path) -> Secret | None:
    """The engines' API key from `engine_auth.key_file` (None without the section): every
    tool that calls engines reads it here, one way, refusing an open or short file."""
    if doc.engine_auth is None:
        return None
    return read_key_file(beside(fleet_path, doc.engine_auth.key_file), "engine_auth.key_file")


def load_fleet(path: Path) -> FleetDocument:
    """Read and validate a fleet document from disk."""
    raw = read_json_document(path, "pass the path of an existing, readable fleet document")
    return parse_fleet(raw, str(path))
