"""A measuring client for one engine, shared by narwhal-profile and narwhal-check.

These tools run before the router takes traffic and off its hot path, so they use aiohttp
rather than the router's hand-written HTTP/1.1 legs: clarity over microseconds. What they
need from an engine, and nothing more: its identity (version, process start, served models),
its Prometheus counters, tokenization, and timed completions, plain or as the producer and
consumer legs of a P/D handoff. Every failure is an `EngineCallFailed` naming the engine, the
path and what came back, so a gate's verdict can say which engine broke and how.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from narwhal.core.profiles import Generation
from narwhal.core.secret import Secret
from narwhal.serve.router.control.attestation import MAX_DOCUMENT_BYTES, Attestation, judge
from narwhal.serve.router.scheduling.generation import (
    GenerationUnreadable,
    parse_start_time,
    parse_version,
)

# The producer leg of a P/D handoff: one token, and keep the KV for a remote decoder. vLLM
# answers with the kv_transfer_params the consumer leg must carry unchanged.
PRODUCER_PARAMS: dict[str, Any] = {"do_remote_decode": True}
EXTERNAL_KV_SOURCE = "external_kv_transfer"


class EngineCallFailed(Exception):
    """One call to one engine failed: unreachable, timed out, or an unexpected answer."""

    def __init__(self, engine_id: str, what: str, detail: str) -> None:
        self.engine_id = engine_id
        self.what = what
        self.detail = detail
        super().__init__(f"{engine_id}: {what}: {detail}")


@dataclass(frozen=True)
class MetricsPage:
    """One scrape of an engine's /metrics: every sample as (name, labels) -> value."""

    text: bytes
    samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float]

    @classmethod
    def parse(cls, text: bytes) -> MetricsPage:
        samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for family in text_string_to_metric_families(text.decode("utf-8", "replace")):
            for s in family.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
        return cls(text, samples)

    def total(self, name: str, **labels: str) -> float:
        """Sum of `name`'s samples whose labels include `labels` (0 when there are none)."""
        want = labels.items()
        return sum(v for (n, lab), v in self.samples.items()
                   if n == name and all(item in lab for item in want))

    def has(self, name: str) -> bool:
        return any(n == name for n, _ in self.samples)

    def external_kv_tokens(self) -> float:
        """Prompt tokens this engine took from a remote producer's KV instead of computing."""
        return self.total("vllm:prompt_tokens_by_source_total", source=EXTERNAL_KV_SOURCE)

    def nixl_transfers(self) -> NixlCounters | None:
        """The NIXL connector's transfer counters, or None when the engine exposes none.

        In vLLM the engine that *reads* (the consumer, in pull mode) records a transfer; the
        producer's `vllm:nixl_*` families exist but stay at zero (tests/fixtures/vllm-0.32.0).
        """
        if not self.has("vllm:nixl_xfer_time_seconds_count"):
            return None
        return NixlCounters(transfers=self.total("vllm:nixl_xfer_time_seconds_count"),
                            bytes=self.total("vllm:nixl_bytes_transferred_sum"),
                            failed=self.total("vllm:nixl_num_failed_transfers_total"))


@dataclass(frozen=True)
class NixlCounters:
    """Cumulative NIXL transfer counters of one engine (a consumer's reads)."""

    transfers: float
    bytes: float
    failed: float

    def since(self, before: NixlCounters) -> NixlCounters:
        return NixlCounters(self.transfers - before.transfers, self.bytes - before.bytes,
                            self.failed - before.failed)


@dataclass(frozen=True)
class Completion:
    """One timed completion: what came back and when."""

    status: int
    body: dict[str, Any]
    text: str
    prompt_tokens: int
    completion_tokens: int
    first_token_s: float  # request sent -> first generated text (non-streamed: the whole answer)
    total_s: float
    token_times_s: tuple[float, ...] = field(default=())  # streamed: arrival of each chunk

    @property
    def kv_transfer_params(self) -> dict[str, Any] | None:
        params = self.body.get("kv_transfer_params")
        return params if isinstance(params, dict) else None


class EngineClient:
    """Calls one engine at `base_url` (no trailing slash) on a shared aiohttp session."""

    def __init__(self, engine_id: str, base_url: str, session: aiohttp.ClientSession,
                 timeout_s: float = 30.0, attestation: Attestation | None = None,
                 key: Secret | None = None) -> None:
        self.id = engine_id
        self.base_url = base_url.rstrip("/")
        self.session = session
        # the engines' API key (fleet: engine_auth), on every call to the engine and only there
        self.headers = {"Authorization": f"Bearer {key.reveal()}"} if key is not None else {}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.attestation = attestation  # Gate E's fleet: the generation includes its digest

    async def _get(self, path: str) -> bytes:
        try:
            async with self.session.get(self.base_url + path, timeout=self.timeout,
                                        headers=self.headers) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise EngineCallFailed(self.id, f"GET {path}", f"answered {resp.status}: {_snippet(body)}")
                return body
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise EngineCallFailed(self.id, f"GET {path}", _describe(exc)) from None

    async def health(self) -> None:
        """GET /health answered 200 (raises EngineCallFailed otherwise)."""
        await self._get("/health")

    async def version(self) -> str:
        try:
            return parse_version(await self._get("/version"))
        except GenerationUnreadable as exc:
            raise EngineCallFailed(self.id, "GET /version", str(exc)) from None

    async def metrics(self) -> MetricsPage:
        text = await self._get("/metrics")
        try:
            return MetricsPage.parse(text)
        except ValueError as exc:
            raise EngineCallFailed(self.id, "GET /metrics", f"not Prometheus text ({exc})") from None

    async def generation(self, page: MetricsPage | None = None) -> Generation:
        """The live generation, as the router reads it (version + process start time); the
        start time from `page` when the caller has just scraped /metrics anyway."""
        version = await self.version()
        try:
            started = parse_start_time(page.text if page is not None else await self._get("/metrics"))
        except GenerationUnreadable as exc:
            raise EngineCallFailed(self.id, "GET /metrics", str(exc)) from None
        return Generation(engine_version=version, process_start_time_seconds=started,
                          attestation_digest=await self.attested_digest())

    async def attested_digest(self) -> str | None:
        """The digest the engine's sidecar vouches for now, when the fleet is attested: a row
        measured on an attested engine names the attestation as part of its generation, and
        an engine whose sidecar refuses (restarted, relaid out) has no generation to measure
        or check against (EngineCallFailed with the sidecar's reason)."""
        a = self.attestation
        if a is None:
            return None
        try:
            async with self.session.get(a.url, timeout=self.timeout,
                                        allow_redirects=False) as resp:
                data = await resp.content.read(MAX_DOCUMENT_BYTES + 1)
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise EngineCallFailed(self.id, "GET attestation", _describe(exc)) from None
        try:
            body = json.loads(data) if len(data) <= MAX_DOCUMENT_BYTES else None
        except ValueError:
            body = None
        why = judge(status, body, a.contract)
        if why:
            raise EngineCallFailed(self.id, "GET attestation", why)
        return a.contract.attestation_digest

    async def model_cards(self) -> list[dict[str, Any]]:
        """The `data` cards of GET /v1/models (vLLM's carry `max_model_len`)."""
        try:
            cards = json.loads(await self._get("/v1/models"))["data"]
            if not isinstance(cards, list) or not all(isinstance(c, dict) and "id" in c
                                                      for c in cards):
                raise TypeError("data is not a list of model cards")
            return cards
        except (ValueError, KeyError, TypeError) as exc:
            raise EngineCallFailed(self.id, "GET /v1/models", f"unexpected body ({exc})") from None

    async def models(self) -> list[str]:
        return [str(card["id"]) for card in await self.model_cards()]

    async def _post(self, path: str, payload: dict[str, Any]) -> tuple[int, bytes]:
        try:
            async with self.session.post(self.base_url + path, json=payload, timeout=self.timeout,
                                         headers=self.headers) as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise EngineCallFailed(self.id, f"POST {path}", _describe(exc)) from None

    async def tokenize(self, model: str, prompt: str) -> list[int]:
        status, body = await self._post("/tokenize", {"model": model, "prompt": prompt})
        if status != 200:
            raise EngineCallFailed(self.id, "POST /tokenize", f"answered {status}: {_snippet(body)}")
        try:
            tokens = json.loads(body)["tokens"]
        except (ValueError, KeyError, TypeError) as exc:
            raise EngineCallFailed(self.id, "POST /tokenize", f"unexpected body ({exc})") from None
        if not isinstance(tokens, list):
            raise EngineCallFailed(self.id, "POST /tokenize", "tokens is not a list")
        return [int(t) for t in tokens]

    async def complete(self, model: str, prompt: str | list[int], max_tokens: int, *,
                       kv_transfer_params: Mapping[str, Any] | None = None,
                       extra: Mapping[str, Any] | None = None) -> Completion:
        """A non-streamed completion; a non-200 answer is returned, not raised (gates judge it)."""
        payload: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                   "temperature": 0, "stream": False, **(extra or {})}
        if kv_transfer_params is not None:
            payload["kv_transfer_params"] = dict(kv_transfer_params)
        started = time.perf_counter()
        status, raw = await self._post("/v1/completions", payload)
        elapsed = time.perf_counter() - started
        try:
            body = json.loads(raw)
        except ValueError:
            body = {"error": {"message": _snippet(raw)}}
        if not isinstance(body, dict):
            body = {"error": {"message": _snippet(raw)}}
        usage = body.get("usage") if status == 200 else None
        choices = body.get("choices") if status == 200 else None
        text = str(choices[0].get("text", "")) if isinstance(choices, list) and choices else ""
        return Completion(status, body, text,
                          int(usage.get("prompt_tokens", 0)) if isinstance(usage, dict) else 0,
                          int(usage.get("completion_tokens", 0)) if isinstance(usage, dict) else 0,
                          elapsed, elapsed)

    async def stream(self, model: str, prompt: str, max_tokens: int, *,
                     kv_transfer_params: Mapping[str, Any] | None = None,
                     extra: Mapping[str, Any] | None = None) -> Completion:
        """A streamed completion with each chunk's arrival time (decode pace, first token)."""
        payload: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                   "temperature": 0, "stream": True, "ignore_eos": True,
                                   "stream_options": {"include_usage": True}, **(extra or {})}
        if kv_transfer_params is not None:
            payload["kv_transfer_params"] = dict(kv_transfer_params)
        started = time.perf_counter()
        times: list[float] = []
        pieces: list[str] = []
        usage: dict[str, Any] = {}
        try:
            async with self.session.post(self.base_url + "/v1/completions", json=payload,
                                         timeout=self.timeout, headers=self.headers) as resp:
                if resp.status != 200:
                    raw = await resp.read()
                    elapsed = time.perf_counter() - started
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        body = {"error": {"message": _snippet(raw)}}
                    return Completion(resp.status, body if isinstance(body, dict) else {}, "", 0, 0,
                                      elapsed, elapsed)
                async for line in resp.content:
                    if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    for choice in chunk.get("choices") or ():
                        if choice.get("text"):
                            times.append(time.perf_counter() - started)
                            pieces.append(choice["text"])
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise EngineCallFailed(self.id, "POST /v1/completions (stream)", _describe(exc)) from None
        total = time.perf_counter() - started
        return Completion(200, {"usage": usage}, "".join(pieces), int(usage.get("prompt_tokens", 0)),
                          int(usage.get("completion_tokens", 0)), times[0] if times else total, total,
                          tuple(times))


@dataclass(frozen=True)
class Handoff:
    """A prompt prefilled on `producer` and decoded on `consumer`, with both legs' timings."""

    producer: str
    consumer: str
    prefill: Completion
    decode: Completion | None  # None when the producer leg already failed

    @property
    def first_token_s(self) -> float:
        """Client-visible first token: the producer leg plus the consumer's first token."""
        return self.prefill.total_s + (self.decode.first_token_s if self.decode else 0.0)


async def handoff(producer: EngineClient, consumer: EngineClient, model: str, prompt: str,
                  max_tokens: int) -> Handoff:
    """Prefill on `producer` (one token, KV kept), then decode on `consumer` with its params."""
    # ignore_eos: a producer whose one token is EOS finishes as "stop" and, like vLLM, keeps no
    # KV for anyone (no params): a probe of the KV path must not hang on the model's choice.
    first = await producer.complete(model, prompt, 1, kv_transfer_params=PRODUCER_PARAMS,
                                    extra={"ignore_eos": True})
    params = first.kv_transfer_params
    if first.status != 200 or params is None:
        return Handoff(producer.id, consumer.id, first, None)
    second = await consumer.complete(model, prompt, max_tokens, kv_transfer_params=params)
    return Handoff(producer.id, consumer.id, first, second)


def clients(engines: Iterable[tuple[str, str]], session: aiohttp.ClientSession,
            timeout_s: float = 30.0, attested: Mapping[str, Attestation] | None = None,
            key: Secret | None = None) -> dict[str, EngineClient]:
    """One client per (engine id, base URL), in fleet order; `attested` gives Gate E's
    sidecar and contract per engine of an attested fleet, `key` the engines' API key."""
    return {eid: EngineClient(eid, url, session, timeout_s, (attested or {}).get(eid), key)
            for eid, url in engines}


def _snippet(body: bytes, limit: int = 200) -> str:
    text = body.decode("utf-8", "replace").strip().replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
