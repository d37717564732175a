"""/metrics with vLLM 0.32.0's families: names, types, label names, label values and buckets.

One `CollectorRegistry` per engine: the process collectors (so `process_start_time_seconds` is
the real start of this process, which binds a profile to an engine generation), then the
families in the order a real engine registers them: the `vllm:nixl_*` family first (only with
a KV connector, as in vLLM), the request, token and latency families fed by the scheduler and
the engine, and `vllm:cache_config_info` last. Like a real engine (prometheus_client defaults),
counters and histograms carry `_created` samples. Every hook is a few attribute reads and
`inc`/`observe` calls on children resolved at startup: nothing is looked up per request.
"""

from __future__ import annotations

import prometheus_client
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector

from narwhal.lab.engine import metric_catalog as mc
from narwhal.lab.engine.config import EngineConfig
from narwhal.lab.engine.engine_plan import EnginePlan
from narwhal.lab.engine.fast_metrics import Buckets, FastRegistry, Value
from narwhal.lab.engine.nixl.api import PullOutcome
from narwhal.lab.engine.scheduler import Seq

LABELS = ["engine", "model_name"]  # vLLM's label order, as its /metrics prints them


class _Families:
    """Declares families on the fast registry with the engine's two label values bound."""

    def __init__(self, fast: FastRegistry, model: str) -> None:
        self.fast = fast
        self.ids = (mc.ENGINE_INDEX, model)

    def gauge(self, name: str, doc: str) -> Value:
        return self.fast.gauge(name, doc, LABELS, [self.ids])[0]

    def counter(self, name: str, doc: str) -> Value:
        return self.fast.counter(name, doc, LABELS, [self.ids])[0]

    def histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Buckets:
        return self.fast.histogram(name, doc, LABELS, self.ids, buckets)

    def gauges_by(self, name: str, doc: str, label: str,
                  values: tuple[str, ...]) -> dict[str, Value]:
        names, rows = self._with(label, values)
        return dict(zip(values, self.fast.gauge(name, doc, names, rows), strict=True))

    def counters_by(self, name: str, doc: str, label: str,
                    values: tuple[str, ...]) -> dict[str, Value]:
        names, rows = self._with(label, values)
        return dict(zip(values, self.fast.counter(name, doc, names, rows), strict=True))

    def _with(self, label: str, values: tuple[str, ...]) -> tuple[list[str], list[list[str]]]:
        """Label names sorted (how vLLM's /metrics prints them) and one value row per value."""
        names = sorted([*LABELS, label])
        rows = [[dict(zip(LABELS, self.ids, strict=True), **{label: v})[n] for n in names]
                for v in values]
        return names, rows


class EngineMetrics:
    """The registry plus the hooks the scheduler (SchedulerObserver), the engine and NIXL
    (KvMetrics) call."""

    def __init__(self, cfg: EngineConfig, plan: EnginePlan, with_nixl: bool) -> None:
        self.registry = reg = CollectorRegistry()
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
        GCCollector(registry=reg)
        fast = FastRegistry()
        f = _Families(fast, cfg.served_model_names[0])
        self._nixl = _NixlFamilies(f) if with_nixl else None
        for name in ("flops", "read_bytes", "write_bytes"):
            f.counter(f"vllm:estimated_{name}_per_gpu",
                      f"Estimated {name.replace('_', ' ')} per GPU (model FLOPs utilization).")
        self._state_families(f)
        self._token_families(f)
        self._request_families(f, plan.max_model_len)
        labels = mc.cache_config_labels(cfg, plan)
        names = sorted(labels)
        fast.gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", names,
                   [[labels[n] for n in names]])[0].set(1.0)
        reg.register(fast)
        self._sched_waiting = self._fetching = self._parked = 0
        self._scheduled_usage = self._held_usage = 0.0

    def _state_families(self, f: _Families) -> None:
        self.running = f.gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = f.gauge("vllm:num_requests_waiting", "Requests waiting to run.")
        self.waiting_by = f.gauges_by("vllm:num_requests_waiting_by_reason",
                               "Waiting requests by why they wait (capacity or deferred); the "
                               "reasons add up to vllm:num_requests_waiting.", "reason",
                               mc.WAITING_REASONS)
        self.fetch_stage = f.gauges_by("vllm:num_requests_kv_fetch_by_stage",
                                "Waiting requests by the stage of their async KV load.",
                                "stage", mc.FETCH_STAGES)
        sleep = f.gauges_by("vllm:engine_sleep_state", "Engine sleep state (awake = 1).",
                     "sleep_state", tuple(s for s, _ in mc.SLEEP_STATES))
        for state, value in mc.SLEEP_STATES:
            sleep[state].set(value)
        self.kv_usage = f.gauge("vllm:kv_cache_usage_perc", "KV cache usage (1 = full).")

    def _token_families(self, f: _Families) -> None:
        self.prefix_queries = f.counter("vllm:prefix_cache_queries",
                                        "Prefix cache queries, in tokens.")
        self.prefix_hits = f.counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.")
        self.external_queries = f.counter("vllm:external_prefix_cache_queries",
                                          "KV connector cache queries, in tokens.")
        self.external_hits = f.counter("vllm:external_prefix_cache_hits",
                                       "KV connector cache hits, in tokens.")
        f.counter("vllm:mm_cache_queries", "Multi-modal cache queries, in items.")
        f.counter("vllm:mm_cache_hits", "Multi-modal cache hits, in items.")
        self.preemptions = f.counter("vllm:num_preemptions", "Preemptions in the engine.")
        self.prompt_tokens = f.counter("vllm:prompt_tokens", "Prefill tokens processed.")
        self.by_source = f.counters_by("vllm:prompt_tokens_by_source",
                              "Prompt tokens by where their KV came from.", "source",
                              mc.SOURCES)
        self.cached_tokens = f.counter("vllm:prompt_tokens_cached",
                                       "Prompt tokens not computed (local or external cache).")
        self.cached_by_source = f.counters_by("vllm:prompt_tokens_cached_by_source",
                                     "Prefix cache hit tokens by the tier that held them, "
                                     "counted at admission.", "source", mc.CACHED_SOURCES)
        self.generation_tokens = f.counter("vllm:generation_tokens",
                                           "Generation tokens processed.")
        self.success = f.counters_by("vllm:request_success", "Finished requests by reason.",
                            "finished_reason", mc.FINISH_REASONS)
        f.fast.counter("vllm:admission_rejections",
                       "Admission attempts a queue limit rejected, by reason.",
                       ["model_name", "reason"], [[f.ids[1], r] for r in mc.REJECTION_REASONS])

    def _request_families(self, f: _Families, max_model_len: int) -> None:
        sizes = mc.one_two_five(max_model_len)
        self.req_prompt = f.histogram("vllm:request_prompt_tokens",
                                      "Prompt tokens per request.", sizes)
        self.req_generation = f.histogram("vllm:request_generation_tokens",
                                          "Generated tokens per request.", sizes)
        self.iteration_tokens = f.histogram("vllm:iteration_tokens_total",
                                            "Tokens per engine step.",
                                            mc.ITERATION_TOKEN_BUCKETS)
        self.req_max_generation = f.histogram("vllm:request_max_num_generation_tokens",
                                              "Most tokens generated by one sequence of a "
                                              "request.", sizes)
        self.req_n = f.histogram("vllm:request_params_n", "The n request parameter.",
                                 mc.PARAMS_N_BUCKETS)
        self.req_max_tokens = f.histogram("vllm:request_params_max_tokens",
                                          "The max_tokens request parameter.", sizes)
        self.ttft = f.histogram("vllm:time_to_first_token_seconds",
                                "Time to first token, seconds.", mc.TTFT_BUCKETS)
        self.itl = f.histogram("vllm:inter_token_latency_seconds",
                               "Inter-token latency, seconds.", mc.ITL_BUCKETS)
        self.tpot = f.histogram("vllm:request_time_per_output_token_seconds",
                                "Mean time per output token of a request, seconds.",
                                mc.ITL_BUCKETS)
        latency = mc.LATENCY_BUCKETS
        self.e2e = f.histogram("vllm:e2e_request_latency_seconds",
                               "End-to-end request latency, seconds.", latency)
        self.queue = f.histogram("vllm:request_queue_time_seconds",
                                 "Time a request spent WAITING, seconds.", latency)
        self.inference = f.histogram("vllm:request_inference_time_seconds",
                                     "Time a request spent RUNNING, seconds.", latency)
        self.prefill = f.histogram("vllm:request_prefill_time_seconds",
                                   "Time a request spent in PREFILL, seconds.", latency)
        self.decode = f.histogram("vllm:request_decode_time_seconds",
                                  "Time a request spent in DECODE, seconds.", latency)
        self.req_preemptions = f.histogram("vllm:request_num_preemptions",
                                           "Times a request was preempted.",
                                           mc.PREEMPTION_BUCKETS)
        self.req_kv_computed = f.histogram("vllm:request_prefill_kv_computed_tokens",
                                           "Prompt tokens whose KV a request's prefill "
                                           "produced (computed or loaded).", sizes)

    # -- SchedulerObserver -------------------------------------------------------------------
    def scheduled(self, seq: Seq) -> None:
        if seq.scheduled_at is not None:
            self.queue.observe(seq.scheduled_at - seq.arrival)

    def first_token(self, seq: Seq) -> None:
        self.generation_tokens.inc()
        if seq.first_token_at is not None:
            self.ttft.observe(seq.first_token_at - seq.arrival)
        n = seq.prompt_len
        # vLLM 0.32 counts a pulled 1-token prompt as local compute (its one token is
        # recomputed), although the block still moved over NIXL.
        external = min(seq.external, n) if n > 1 else 0
        hit = min(seq.local_hit, n - external)
        self.prompt_tokens.inc(n)
        self.by_source["external_kv_transfer"].inc(external)
        self.by_source["local_cache_hit"].inc(hit)
        self.by_source["local_compute"].inc(n - external - hit)
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
        self.req_max_generation.observe(seq.produced)
        self.req_preemptions.observe(seq.preemptions)
        self.req_kv_computed.observe(seq.prompt_len - seq.local_hit)
        if seq.scheduled_at is not None:
            self.inference.observe(end - seq.scheduled_at)
            if seq.first_token_at is not None:
                self.prefill.observe(seq.first_token_at - seq.scheduled_at)
                self.decode.observe(end - seq.first_token_at)
                if seq.produced > 1:
                    self.tpot.observe((end - seq.first_token_at) / (seq.produced - 1))

    def step(self, running: int, waiting: int, blocked_by_capacity: bool, used_blocks: int,
             total_blocks: int, tokens: int = 0) -> None:
        """One engine step: `waiting` all wait for capacity (a slot or KV blocks)."""
        del blocked_by_capacity
        self.running.set(running)
        self._sched_waiting = waiting
        self._waiting_changed()
        self._scheduled_usage = used_blocks / total_blocks if total_blocks else 0.0
        self._set_kv_usage()
        if tokens:
            self.iteration_tokens.observe(tokens)

    def preempted(self, seq: Seq) -> None:
        self.preemptions.inc()

    # -- request-level hooks from the engine ---------------------------------------------------
    def admitted(self, prompt_len: int, max_tokens: int, local_hit: int, external: int,
                 external_queried: bool) -> None:
        self.req_max_tokens.observe(max_tokens)
        self.req_n.observe(1)
        self.prefix_queries.inc(prompt_len)
        self.prefix_hits.inc(local_hit)
        self.cached_by_source["device"].inc(local_hit)
        if external_queried:
            self.external_queries.inc(prompt_len)
            self.external_hits.inc(external)
            self.cached_by_source["p2p"].inc(external)

    def load_failed(self, prompt_len: int, elapsed: float) -> None:
        """A remote KV load failed: vLLM finishes the request with reason "error", no token."""
        self.success["error"].inc()
        for seconds in (self.e2e, self.ttft, self.queue, self.inference, self.prefill):
            seconds.observe(elapsed)
        for zero in (self.decode, self.tpot, self.req_generation, self.req_max_generation,
                     self.req_preemptions):
            zero.observe(0)
        self.req_prompt.observe(prompt_len)
        self.req_kv_computed.observe(prompt_len)

    def fetching(self, delta: int) -> None:
        """A request's remote KV load started (+1) or ended (-1)."""
        self._fetching += delta
        self.fetch_stage["in_progress"].set(self._fetching)
        self._waiting_changed()

    def parked(self, delta: int) -> None:
        """A request now waits for a KV load that will never start (+1), or stopped (-1)."""
        self._parked += delta
        self.fetch_stage["waiting_to_start"].set(self._parked)
        self._waiting_changed()

    def _waiting_changed(self) -> None:
        deferred = self._fetching + self._parked
        self.waiting.set(self._sched_waiting + deferred)
        self.waiting_by["capacity"].set(self._sched_waiting)
        self.waiting_by["deferred"].set(deferred)

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

    def kv_held(self, blocks: int, capacity: int) -> None:
        """Blocks the connector holds under leases for remote readers (producer side)."""
        self._held_usage = blocks / capacity if capacity else 0.0
        self._set_kv_usage()

    def _set_kv_usage(self) -> None:
        self.kv_usage.set(min(1.0, self._scheduled_usage + self._held_usage))

    def notification_after_expiry(self) -> None:
        if self._nixl is not None:
            self._nixl.after_expiry.inc()

    def render(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)


class _NixlFamilies:
    """The vllm:nixl_* metrics of the KV connector."""

    def __init__(self, f: _Families) -> None:
        self.xfer = f.histogram("vllm:nixl_xfer_time_seconds",
                                "NIXL KV transfer duration, seconds.", mc.NIXL_XFER_BUCKETS)
        self.post = f.histogram("vllm:nixl_post_time_seconds",
                                "NIXL KV transfer post time, seconds.", mc.NIXL_POST_BUCKETS)
        self.bytes = f.histogram("vllm:nixl_bytes_transferred",
                                 "Bytes moved per NIXL KV transfer.", mc.NIXL_BYTES_BUCKETS)
        self.descriptors = f.histogram("vllm:nixl_num_descriptors",
                                       "Descriptors per NIXL KV transfer.",
                                       mc.NIXL_DESCRIPTOR_BUCKETS)
        self.failed_transfers = f.counter("vllm:nixl_num_failed_transfers",
                                          "Failed NIXL KV transfers, handshakes and "
                                          "notifications included.")
        self.failed_notifications = f.counter("vllm:nixl_num_failed_notifications",
                                              "Failed NIXL KV notifications (also counted "
                                              "in vllm:nixl_num_failed_transfers).")
        self.expired = f.counter("vllm:nixl_num_kv_expired_reqs",
                                 "Requests whose held KV expired (producer side).")
        self.after_expiry = f.counter("vllm:nixl_num_notifications_after_expiry",
                                      "Notifications for requests no longer held, one per "
                                      "remote rank.")

    def done(self, outcome: PullOutcome) -> None:
        self.xfer.observe(outcome.seconds)
        self.post.observe(outcome.post_seconds)
        self.bytes.observe(outcome.bytes_moved)
        self.descriptors.observe(outcome.descriptors)
