"""The typed, validated inputs of one deployment, as read from the workstation `.env`."""

from __future__ import annotations

from pathlib import Path

from pydantic import ConfigDict, Field

from narwhal.core.document_io import StrictModel
from narwhal.core.fleet import KV_CANARY_INTERVAL_S
from narwhal.core.secret import Secret
from narwhal.deploy.inputs.destination import Destination


class _Frozen(StrictModel):
    # Built from values the `.env` grammar already checked as text (vocabulary.py, fields.py,
    # which refuses NaN itself), with pydantic's lax conversion, and holding Path and Secret:
    # so lax, arbitrary types allowed, and NaN left to the grammar, as before.
    model_config = ConfigDict(strict=False, arbitrary_types_allowed=True, allow_inf_nan=True)


class EngineInputs(_Frozen):
    """One engine role (`engine-<n>`), globals already merged with its NODE overrides."""

    n: int
    ssh: Destination
    ssh_password: Secret | None = None
    ssh_key: str | None = None
    ip: str | None = None
    url: str | None = None
    attestation_url: str | None = None
    engine_image: str
    model_name: str
    model_dir: str
    run_dir: str
    fabric_interface: str
    engine_port: int
    attest_port: int
    nixl_side_channel_port: int
    # where the engine publishes vLLM's KV cache events (--kv-events-config); None: it does not
    kv_events_port: int | None = None
    ucx_tcp_port_range: tuple[int, int]
    gpu_ids: tuple[str, ...] | None = None
    tensor_parallel_size: int | None = None
    model_dtype: str | None = None
    block_size: int = 128
    engine_args: tuple[str, ...] | None = None
    engine_env: dict[str, str | Secret] | None = None  # secret-named values are Secret
    transfer_transport: str = "ucx_tcp"
    transfer_net_devices: str | None = None
    transfer_devices: tuple[str, ...] = ()
    gpu_tls: str | None = None
    kv_buffer_device: str | None = None  # where NIXL stages KV (vLLM's default when None)
    model_config_sha256: str | None = None
    gpu_memory_utilization: float | None = None

    @property
    def role(self) -> str:
        return f"engine-{self.n}"


DEFAULT_ROUTER_URL = "http://127.0.0.1:8000"  # the private path, reached through the tunnel


class RouterInputs(_Frozen):
    """The router and observability host."""

    ssh: Destination
    ssh_password: Secret | None = None
    ssh_key: str | None = None
    url: str | None = None
    standby_url: str | None = None  # a warm standby router on the same host, when set
    api_key: Secret | None = None


class Workload(StrictModel):
    """The load the fleet is sized for. Gate D budgets every directed edge from it and the
    "workload" fingerprint digests it, so a changed load makes the budget (and what was
    measured against it) stale. Read from the optional NARWHAL_WORKLOAD_* variables.

    Gate D hands it to `core.kv.budget.Workload` (deploy/fabric/budget.py): the same fields,
    the transfer budget in milliseconds here as operators state it, seconds there."""

    prompt_tokens: int = Field(default=1024, ge=1, le=10_000_000)  # a typical prompt
    handoffs_per_s: float = Field(default=1.0, gt=0)  # mean prefill-to-decode handoffs
    # handoffs that can arrive at once, each of which must finish within the transfer budget
    burst: int = Field(default=1, ge=1, le=100_000)
    transfer_budget_ms: float = Field(default=1000.0, gt=0)  # time one handoff may take
    headroom: float = Field(default=1.25, ge=1)  # margin on the required bandwidth


class CheckpointSource(_Frozen):
    """Where Gate A stages the checkpoint from: a Hugging Face repo at a revision, on a hub.

    `revision` is what the operator wrote (a branch, a tag or a commit); Gate A resolves it to
    a commit once and every host downloads that commit (deploy/checkpoint/pin.py)."""

    repo_id: str
    revision: str = "main"
    endpoint: str | None = None  # HF_ENDPOINT; None: huggingface_hub's own default


class Inputs(_Frozen):
    """Everything a deployment starts from. Secrets are `Secret`; nothing else is secret."""

    source: Path
    deployment: str
    revision: str
    engines: tuple[EngineInputs, ...]
    router: RouterInputs
    ssh_key: str | None = None
    known_hosts: str | None = None
    connect_timeout_s: int = 10
    ttft_s: float = 10.0
    tpot_s: float = 0.125
    engine_key: Secret | None = None
    hf_token: Secret | None = None
    # MODEL_REPO_ID (with MODEL_REVISION and HF_ENDPOINT): Gate A stages the checkpoint on
    # every engine host from the hub; None: the checkpoint is whatever Gate A finds there
    checkpoint: CheckpointSource | None = None
    grafana_bind_address: str | None = None
    prometheus_listen_address: str | None = None
    shared_gpu_allowance: bool | None = None
    # seconds in which the router's live KV canary probes each ordered pair once (Gate F
    # writes it as the fleet's kv_canary.interval_s); the default is that field's own
    kv_canary_interval_s: float = KV_CANARY_INTERVAL_S
    workload: Workload = Workload()
    # The `.env` text as read, every secret masked (inputs/masked.py): what each ledger attempt
    # keeps a copy of. Left out of dumps (`narwhal inputs --json` shows the values themselves).
    masked_env: str = Field(default="", exclude=True, repr=False)

    def secrets(self) -> list[Secret]:
        """Every secret value held, for redaction and leak scans."""
        found: list[Secret | None] = [self.engine_key, self.hf_token, self.router.ssh_password,
                                      self.router.api_key]
        found += [e.ssh_password for e in self.engines]
        found += [v for e in self.engines for v in (e.engine_env or {}).values()
                  if isinstance(v, Secret)]
        return [s for s in found if s is not None and s.reveal()]
