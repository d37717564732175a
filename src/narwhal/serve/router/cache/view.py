"""The router's cache state for one fleet, and the three moments the request path asks it.

- before placement (`before`): the prompt's token ids from the model's tokenizer, the exact
  prompt length from them, and each engine's matched prefix tokens for the chooser to price;
- once placed (`placed`): what was predicted on which engine and the decision taken, and,
  for engines without events, the prompt recorded as now held there (both legs' engines: the
  decode engine keeps the KV it pulled);
- when the prefill leg answers (`observed`): the engine's own count of cached prompt tokens
  (`usage.prompt_tokens_details.cached_tokens`, when the engine reports it).
Engines that publish KV events are followed by feed.py; the others by routing history, sized
from the engine's `vllm:cache_config_info` (index.py says why both are stated, never mixed).
"""

from __future__ import annotations

import re
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from narwhal.serve.router.cache.feed import follow
from narwhal.serve.router.cache.fleet import FleetCache, PromptKeys
from narwhal.serve.router.cache.index import EngineCache
from narwhal.serve.router.cache.prompt_ids import PromptTokenizer
from narwhal.serve.router.scheduling.engines import Engine, Placement
from narwhal.serve.router.settings import CacheSettings

_CACHE_INFO = re.compile(rb"^vllm:cache_config_info\{([^}]*)\}", re.M)
_LABEL = re.compile(rb'(\w+)="([^"]*)"')

LOCAL = "local_cached"  # run whole where the prefix is cached (scheduler._cache_local)
PLAIN = "plain"
SPLIT = "split"


def cache_info(metrics_text: bytes) -> tuple[int, int] | None:
    """(block_size, num_gpu_blocks) from an engine's vllm:cache_config_info, if it says both."""
    found = _CACHE_INFO.search(metrics_text)
    if found is None:
        return None
    labels = dict(_LABEL.findall(found.group(1)))
    try:
        return int(labels.get(b"block_size", b"")), int(labels.get(b"num_gpu_blocks", b""))
    except ValueError:
        return None


def decision(placement: Placement) -> str:
    if placement.cache_local:
        return LOCAL
    return PLAIN if placement.single else SPLIT


class CacheView:
    """Tokenizer, every engine's cache and the counters the journal and /metrics show."""

    def __init__(self, settings: CacheSettings, engine_ids: Sequence[str]) -> None:
        self.settings = settings
        self.tokenizer = PromptTokenizer(settings.tokenizer_dir)
        self.fleet = FleetCache({
            e: EngineCache("events", 0) if e in settings.events
            else EngineCache("approximate", settings.approximate_blocks)
            for e in engine_ids})
        self.blind = 0
        self.predicted: dict[str, int] = {}
        self.observed_tokens: dict[str, int] = {}
        self.decisions: dict[str, int] = {}

    def off_loop(self, call: Any) -> bool:
        """Whether the call's prompt is long enough to tokenize on a worker thread (below
        that, the thread hop costs more than the event loop loses)."""
        return call.prompt_tokens is None and call.estimate >= self.settings.off_loop_tokens

    def ids_off_loop(self, call: Any) -> list[int] | None:
        """The call's prompt ids, computed on a worker thread (touches nothing shared)."""
        return self.tokenizer.ids(call.route, call.body, release_gil=True)

    def before(self, call: Any) -> None:
        """Set the call's prompt ids, exact length and matched tokens per engine."""
        self.apply(call, self.tokenizer.ids(call.route, call.body))

    def apply(self, call: Any, ids: list[int] | None) -> None:
        """The call's prompt ids (None: none could be made) as its exact length and keys."""
        if ids is None:
            self.blind += 1
            return
        keys = PromptKeys(ids)
        call.prompt_keys = keys
        call.prompt_tokens = len(ids)
        call.cached = self.fleet.matched_tokens(keys)

    def placed(self, call: Any, placement: Placement) -> None:
        keys = call.prompt_keys
        if keys is None:
            return
        engine = placement.prefill.spec.id
        self.predicted[engine] = self.predicted.get(engine, 0) + placement.cached_tokens
        kind = decision(placement)
        self.decisions[kind] = self.decisions.get(kind, 0) + 1
        self.fleet.routed(engine, keys)
        if not placement.single:
            self.fleet.routed(placement.decode.spec.id, keys)

    def observed(self, call: Any, engine: Engine, usage: object) -> None:
        """The engine's own cached-token count for the prompt it just computed."""
        if call.prompt_keys is None:
            return
        hit = cached_tokens(usage)
        if hit is not None:
            call.observed_hit = hit
            self.observed_tokens[engine.id] = self.observed_tokens.get(engine.id, 0) + hit

    def size(self, engine_id: str, metrics_text: bytes) -> None:
        """An approximate engine's block size and capacity from its own /metrics."""
        cache = self.fleet.engines.get(engine_id)
        if cache is None or cache.mode != "approximate":
            return
        info = cache_info(metrics_text)
        if info is None:
            return
        cache.block_size = info[0]
        if not self.settings.approximate_blocks:
            cache.capacity = info[1]

    def feeds(self) -> list[Coroutine[Any, Any, None]]:
        return [follow(e, endpoint, topic, self.fleet.engines[e])
                for e, (endpoint, topic) in sorted(self.settings.events.items())
                if e in self.fleet.engines]

    def state(self) -> dict[str, Any]:
        return {"engines": self.fleet.state(), "blind_requests": self.blind,
                "template_failures": self.tokenizer.failures,
                "predicted_hit_tokens": dict(self.predicted),
                "observed_hit_tokens": dict(self.observed_tokens),
                "decisions": dict(self.decisions)}


class CacheFamilies(Collector):
    """The cache's /metrics families, built at scrape time like the router's own."""

    def __init__(self, view: CacheView) -> None:
        self._view = view

    def collect(self) -> Iterable[Any]:
        view = self._view
        mode = GaugeMetricFamily("narwhal_router_cache_mode",
                                 "How the router knows each engine's prefix cache (1: this mode)",
                                 labels=["engine", "mode"])
        blocks = GaugeMetricFamily("narwhal_router_cache_blocks",
                                   "Blocks the router believes each engine holds",
                                   labels=["engine"])
        for name, cache in sorted(view.fleet.engines.items()):
            mode.add_metric([name, cache.mode], 1.0)
            blocks.add_metric([name], float(cache.blocks))
        yield mode
        yield blocks
        for family, helptext, values in (
                ("narwhal_router_cache_predicted_hit_tokens",
                 "Prompt tokens placement predicted the computing engine holds", view.predicted),
                ("narwhal_router_cache_observed_hit_tokens",
                 "Cached prompt tokens the engine reported for prefills it computed",
                 view.observed_tokens)):
            counter = CounterMetricFamily(family, helptext, labels=["engine"])
            for name, n in sorted(values.items()):
                counter.add_metric([name], float(n))
            yield counter
        decisions = CounterMetricFamily("narwhal_router_cache_decisions",
                                        "Placements by how the request ran", labels=["decision"])
        for kind, n in sorted(view.decisions.items()):
            decisions.add_metric([kind], float(n))
        yield decisions
        events = CounterMetricFamily("narwhal_router_cache_events",
                                     "KV event batches and losses by engine",
                                     labels=["engine", "kind"])
        for name, cache in sorted(view.fleet.engines.items()):
            if cache.mode == "events":
                for kind, n in sorted(cache.counts.items()):
                    events.add_metric([name, kind], float(n))
        yield events


def cached_tokens(usage: object) -> int | None:
    """The prompt tokens an engine did not compute for a request (its prefix cache or a
    producer's KV), from its answer's `usage.prompt_tokens_details.cached_tokens`, which vLLM
    reports with --enable-prompt-tokens-details; None when it does not."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    hit = details.get("cached_tokens") if isinstance(details, dict) else None
    return hit if type(hit) is int and hit >= 0 else None
