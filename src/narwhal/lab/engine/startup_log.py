"""The startup lines vLLM prints, in its order, with the emulator's own numbers.

These are what operators and core/kv's `parse_startup_log` read: the attention backend, the
KV layout (NIXL's intent line and the resolved one), the memory given to the KV cache, the KV
cache size and maximum concurrency, and uvicorn's "Application startup complete.".
"""

from __future__ import annotations

import logging
import os

from narwhal.lab.engine.config import GIB, EngineConfig
from narwhal.lab.engine.engine_plan import EnginePlan
from narwhal.lab.engine.logs import API_SERVER, ENGINE_CORE, at, thousands, uvicorn

ROUTES = (("/health", "GET"), ("/ping", "GET"), ("/version", "GET"), ("/v1/models", "GET"),
          ("/metrics", "GET"), ("/load", "GET"), ("/tokenize", "POST"), ("/detokenize", "POST"),
          ("/v1/completions", "POST"), ("/v1/chat/completions", "POST"))


def log_config(log: logging.Logger, cfg: EngineConfig, non_default: dict[str, object]) -> None:
    log.info("vLLM API server version %s", cfg.vllm_version, extra=at("api_server.py:1951"))
    log.info("non-default args: %s", non_default, extra=at("utils.py:253"))


def log_engine(log: logging.Logger, cfg: EngineConfig, plan: EnginePlan,
               architecture: str) -> None:
    """Model resolution and engine-core initialisation, up to the KV cache lines."""
    core = ENGINE_CORE
    launch = plan.launch
    log.info("Resolved architecture: %s", architecture, extra=at("model.py:631"))
    log.info("Using max model len %d", plan.max_model_len, extra=at("model.py:1788"))
    log.info("Chunked prefill is enabled with max_num_batched_tokens=%d.",
             plan.max_num_batched_tokens, extra=at("scheduler.py:222"))
    log.info("Initializing a V1 LLM engine (v%s) with config: model=%r, speculative_config=%s, "
             "tokenizer=%r, dtype=torch.%s, max_seq_len=%d, tensor_parallel_size=%d, "
             "pipeline_parallel_size=%d, data_parallel_size=%d, kv_cache_dtype=%s, "
             "served_model_name=%s, enable_prefix_caching=%s", cfg.vllm_version, cfg.model,
             launch.speculative, cfg.model, plan.geometry.dtype, plan.max_model_len,
             launch.tensor_parallel_size, launch.pipeline_parallel_size,
             launch.data_parallel_size, launch.kv_cache_dtype, cfg.served_model_names[0],
             launch.enable_prefix_caching, extra=at("core.py:93", core))
    if cfg.kv_role == "kv_both":
        log.warning("kv_role 'kv_both' is deprecated for NixlConnector; set kv_producer for "
                    "prefill and kv_consumer for decode", extra=at("connector.py:118", core))
    backend = plan.geometry.hash_factors.get("attn_backend_name")
    platform = "cpu.py:221" if cfg.emu.platform == "cpu" else "cuda.py:301"
    log.info("Detected attention backend(s) ['%s']", backend, extra=at(platform, core))
    if cfg.kv_transfer_config is not None:
        log.info("NixlConnector setting KV cache layout to LBHNC for better xfer performance.",
                 extra=at("nixl_connector.py:212", core))
    log.info("Using %s KV cache layout.", plan.geometry.kv_cache_layout,
             extra=at("kv_cache_layout.py:97", core))


def log_kv_cache(log: logging.Logger, cfg: EngineConfig, plan: EnginePlan, took: float) -> None:
    core = ENGINE_CORE
    available = plan.memory.available / GIB
    if cfg.emu.platform == "cpu":
        log.info("Explicitly set (%s/%.2f) GiB for KV cache on node 0.", str(round(available, 4)),
                 plan.memory.device / GIB, extra=at("cpu_worker.py:260", core))
        device = "CPU"
    else:
        log.info("Available KV cache memory: %.2f GiB", available, extra=at("gpu_worker.py:298",
                                                                             core))
        device = "GPU"
    log.info("%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx",
             device, thousands(plan.kv_cache_size_tokens), thousands(plan.max_model_len),
             plan.max_concurrency, extra=at("kv_cache_utils.py:2327", core))
    log.info("init engine (profile, create kv cache, warmup model) took %.2f s", took,
             extra=at("core.py:402", core))


def log_serving(log: logging.Logger, host: str, port: int) -> None:
    log.info("Starting vLLM API server 0 on http://%s:%d", host, port,
             extra=at("api_server.py:2012", API_SERVER))
    log.info("Available routes are:", extra=at("launcher.py:37"))
    for path, method in ROUTES:
        log.info("Route: %s, Methods: %s", path, method, extra=at("launcher.py:45"))
    log.info("Started server process [%d]", os.getpid(), extra=uvicorn())
    log.info("Waiting for application startup.", extra=uvicorn())
    log.info("Application startup complete.", extra=uvicorn())
