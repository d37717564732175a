"""One client completion request: its checked body, the two leg bodies, timings and outcome.

Only the fields the router acts on are checked here (model, prompt or messages, stream,
token limits, n, kv_transfer_params); everything else passes to the engines untouched, and
they answer with their own 400 if a field is wrong. The client body is encoded once without
the router-owned keys; each leg body is that encoding with a small prefix of leg keys, so a
long prompt is encoded once, not twice.
"""

from __future__ import annotations

import time
from typing import Any

from narwhal.serve.router.front.front import ClientConnection
from narwhal.serve.router.jsonio import dumps, loads, nests_deeper
from narwhal.serve.router.request.decisions import Decision
from narwhal.serve.router.request.relay import DecodeRelay
from narwhal.serve.router.request.token_estimate import BytesPerToken
from narwhal.serve.router.scheduling.engines import Engine, Placement

# The deepest nesting a client body may hold: the legs are encoded again, and orjson writes at
# most 254 levels (a leg adds one), so a body deeper than this is refused before any leg.
MAX_BODY_DEPTH = 128
_BOM = b"\xef\xbb\xbf"

# Keys the router sets per leg; the client's values travel only in the decode prefix.
_LEG_KEYS = frozenset({"stream", "stream_options", "max_tokens", "max_completion_tokens",
                       "min_tokens", "kv_transfer_params", "ignore_eos", "stop", "stop_token_ids"})
# The client's keys among those that the decode leg carries as the client sent them.
_DECODE_KEYS = ("max_tokens", "max_completion_tokens", "min_tokens", "ignore_eos", "stop",
                "stop_token_ids")
# The prefill leg's own keys never change: one token, no stream, ask the producer to keep the KV.
# EOS and stop sequences are ignored there: the producer's token is discarded (the consumer
# samples its own first token from the pulled KV), and a producer that stops on EOS or a stop
# string finishes as "stop" and, like vLLM's connector, keeps no KV: the request would fail
# with no handoff although the decode engine would have answered it.
_PREFILL_COMPLETION = (b'{"max_tokens":1,"stream":false,"ignore_eos":true,'
                       b'"kv_transfer_params":{"do_remote_decode":true}')
_PREFILL_CHAT = (b'{"max_tokens":1,"max_completion_tokens":1,"stream":false,"ignore_eos":true,'
                 b'"kv_transfer_params":{"do_remote_decode":true}')

_RELEASE_COMPLETION = b'{"max_tokens":1,"stream":false,"ignore_eos":true,"kv_transfer_params":'
_RELEASE_CHAT = (b'{"max_tokens":1,"max_completion_tokens":1,"stream":false,"ignore_eos":true,'
                 b'"kv_transfer_params":')


class BadRequest(Exception):
    """The client body breaks a rule the router relies on."""

    def __init__(self, status: int, message: str, param: str | None, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code


def _positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise BadRequest(400, f"'{key}' must be a whole number of at least 1", key, "invalid_value")
    return value


# Integers an engine can take as int64; orjson reads larger integer literals as floats, which
# an engine would take as a different number (or fail on), so they are refused here.
_INT_LIMIT = float(2**63)


def _number_problem(key: str, value: Any) -> BadRequest | None:
    kind = type(value)
    if (kind is int and not -(2**63) <= value < 2**63) or (kind is float and abs(value) >= _INT_LIMIT):
        return BadRequest(400, f"'{key}' is out of range: numbers must lie within a signed "
                          "64-bit integer's range", key, "invalid_value")
    return None


def _check_numbers(body: dict[str, Any]) -> None:
    """Refuse numbers no engine reads as sent: top-level values, and one level into small
    objects and lists (stream_options, logit_bias, stop_token_ids, a token-id prompt)."""
    for key, value in body.items():
        kind = type(value)
        if kind is int or kind is float:
            bad = _number_problem(key, value)
        elif kind is dict and len(value) <= 4096:
            bad = next((p for k, v in value.items()
                        if (type(v) is int or type(v) is float)
                        and (p := _number_problem(f"{key}.{k}", v)) is not None), None)
        elif kind is list and len(value) <= 1_000_000:
            bad = next((p for v in value
                        if (type(v) is int or type(v) is float)
                        and (p := _number_problem(key, v)) is not None), None)
        else:
            bad = None
        if bad is not None:
            raise bad


def parse_object(raw: bytes) -> dict[str, Any]:
    """A client body as a JSON object; BadRequest (400) naming what is wrong with it. A UTF-8
    byte order mark before it is skipped, as vLLM's server does; nesting is bounded to what
    the router can encode again when it writes the legs (`MAX_BODY_DEPTH`)."""
    if raw.startswith(_BOM):
        raw = raw[len(_BOM):]
    try:
        body = loads(raw)
    except ValueError as exc:
        raise BadRequest(400, f"request body is not valid JSON ({exc})", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest(400, "request body must be a JSON object", None, "invalid_json")
    if nests_deeper(raw, body, MAX_BODY_DEPTH):
        raise BadRequest(400, f"request body nests arrays or objects deeper than {MAX_BODY_DEPTH} "
                         "levels", None, "invalid_json")
    _check_numbers(body)
    return body


def check_tokenize_body(raw: bytes, model: str) -> dict[str, Any]:
    """A /tokenize or /detokenize body: a JSON object for this router's model."""
    body = parse_object(raw)
    asked = body.get("model")
    if asked is not None and asked != model:
        raise BadRequest(404, f"The model `{asked}` does not exist. This router serves `{model}`.",
                         "model", "model_not_found")
    return body


def check_body(raw: bytes, chat: bool, model: str) -> dict[str, Any]:
    """Parse and check a completion body; raise BadRequest naming the field and the fix."""
    body = parse_object(raw)
    asked = body.get("model")
    if asked is not None and asked != model:
        raise BadRequest(404, f"The model `{asked}` does not exist. This router serves `{model}`.",
                         "model", "model_not_found")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest(400, "'messages' must be a non-empty list of chat messages",
                             "messages", "invalid_value")
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            if not prompt:
                raise BadRequest(400, "'prompt' is an empty list", "prompt", "invalid_value")
            if not all(type(t) is int for t in prompt) and len(prompt) > 1:
                raise BadRequest(400, "batched prompts are not supported through prefill/decode "
                                 "routing; send one prompt per request", "prompt", "invalid_value")
        elif not isinstance(prompt, str) or not prompt:
            raise BadRequest(400, "'prompt' must be a non-empty string or a list of token ids",
                             "prompt", "invalid_value")
    stream = body.get("stream", False)
    if type(stream) is not bool:
        raise BadRequest(400, "'stream' must be true or false", "stream", "invalid_type")
    if "stream_options" in body and not (stream and isinstance(body["stream_options"], dict)):
        raise BadRequest(400, "'stream_options' needs 'stream': true and must be an object",
                         "stream_options", "invalid_value")
    _positive_int(body, "max_tokens")
    _positive_int(body, "max_completion_tokens")
    n = body.get("n", 1)
    if type(n) is not int or n != 1:
        raise BadRequest(400, "'n' must be 1 through prefill/decode routing; send n requests",
                         "n", "invalid_value")
    if "kv_transfer_params" in body:
        raise BadRequest(400, "'kv_transfer_params' is set by the router; remove it",
                         "kv_transfer_params", "invalid_value")
    return body


class Call:
    """Everything the router knows about one accepted request, through to its journal row."""

    __slots__ = ("_base", "body", "cached", "carried", "chat", "conn", "continued", "decision",
                 "decode_attempts", "decode_engine", "decode_tries", "estimate", "estimator",
                 "events", "events_before", "finished", "gone", "handoff_s", "http11",
                 "keep_alive", "kv", "leg_id", "max_tokens", "mode", "observed_hit", "path",
                 "placement", "prefill_engine", "prefill_s", "prefill_tries", "prompt_keys",
                 "prompt_tokens", "reason", "received", "relay", "request_id", "route", "status",
                 "stream", "t0", "t_first_token", "t_prefill_done", "t_prefill_start", "tenant",
                 "tpot_s", "ttft_s", "unresumable")

    def __init__(self, body: dict[str, Any], chat: bool, request_id: bytes, tenant: str | None,
                 conn: ClientConnection, keep_alive: bool = True, http11: bool = True,
                 estimator: BytesPerToken | None = None, *, leg_id: bytes = b"") -> None:
        self.t0 = time.monotonic()
        self.received = time.time()
        self.body = body
        self.chat = chat
        self.route = "chat" if chat else "completions"
        self.path = b"/v1/chat/completions" if chat else b"/v1/completions"
        self.request_id = request_id  # the client's x-request-id (or leg_id): echoed, journaled
        self.leg_id = leg_id or request_id  # router-made: the only id engines ever see
        self.tenant = tenant
        self.keep_alive = keep_alive
        self.http11 = http11
        self.stream: bool = body.get("stream", False)
        mt = body.get("max_completion_tokens") if chat else None
        self.max_tokens: int | None = mt if mt is not None else body.get("max_tokens")
        self.prompt_tokens: int | None = None
        self.mode = "split"
        self.prefill_engine: str | None = None
        self.decode_engine: str | None = None
        self.decode_attempts = 0
        self.relay: DecodeRelay | None = None
        self.conn = conn
        self.placement: Placement | None = None
        self.prefill_tries: list[Engine] = []
        self.decode_tries: list[Engine] = []
        self.kv: bytes | None = None
        self.finished = False
        self.gone = False
        self.t_prefill_start = 0.0
        self.t_prefill_done = 0.0
        self.prefill_s: float | None = None
        self.handoff_s: float | None = None
        self.ttft_s: float | None = None
        self.tpot_s: float | None = None
        self.events = 0
        self.status = 0
        self.decision: Decision | None = None  # the decision table's row that settled it
        # cache-aware placement (router/cache/view.py): matched prefix tokens per engine, the
        # prompt's block keys, and the cached tokens the computing engine reported
        self.cached: dict[str, int] | None = None
        self.prompt_keys: Any = None
        self.observed_hit: int | None = None
        # a stream continued on another engine after its decode engine broke (continuation.py)
        self.unresumable: str | None = None  # why it may not be ("" it may; None: not asked)
        self.continued: list[dict[str, Any]] | None = None
        self.carried = 0  # answer tokens a continued request's prompt carries
        self.t_first_token = 0.0  # the first leg's first token, once a stream was continued
        self.events_before = 0  # events the client had from legs before the current one
        self.reason = ""
        self._base = dumps({k: v for k, v in body.items() if k not in _LEG_KEYS})
        self._price_prompt(body.get("prompt"), estimator)

    def _price_prompt(self, prompt: Any, estimator: BytesPerToken | None) -> None:
        """Prompt length for pricing before the engine tells it: a token-id prompt counts its
        ids; text is priced by body bytes over the learned bytes per token (token_estimate.py)."""
        if isinstance(prompt, list):
            self.prompt_tokens = len(prompt)  # token ids: the exact length, known now
        self.estimator = None if isinstance(prompt, list) else estimator
        self.estimate = len(prompt) if isinstance(prompt, list) else (
            estimator.tokens(self.route, len(self._base)) if estimator is not None
            else len(self._base) >> 2)

    def learned(self, prompt_tokens: int) -> None:
        """An engine counted the prompt: price by that from now on, and teach the estimator."""
        self.prompt_tokens = prompt_tokens
        if self.estimator is not None:
            self.estimator.observe(self.route, len(self._base), prompt_tokens)

    @property
    def price_tokens(self) -> int:
        pt = self.prompt_tokens
        return (pt if pt is not None else self.estimate) + self.carried

    def record_continuation(self, failed: str, engine: str, after_tokens: int, reason: str,
                            exact: bool) -> None:
        """The journal's account of one continuation: from which engine to which, after how
        many answer tokens, why, and whether the rest is what the unbroken stream gives."""
        if self.continued is None:
            self.continued = []
        self.continued.append({"from": failed, "to": engine, "after_tokens": after_tokens,
                               "reason": reason, "exact": exact})

    @property
    def ttft_error_s(self) -> float | None:
        ttft = self.ttft_s
        placement = self.placement
        if (ttft is None or placement is None or placement.predicted_ttft_s <= 0.0
                or len(self.prefill_tries) > 1 or len(self.decode_tries) > 1):
            return None
        return ttft - placement.predicted_ttft_s

    @property
    def tpot_error_s(self) -> float | None:
        tpot = self.tpot_s
        placement = self.placement
        if (tpot is None or placement is None or placement.predicted_tpot_s <= 0.0
                or len(self.prefill_tries) > 1 or len(self.decode_tries) > 1):
            return None
        return tpot - placement.predicted_tpot_s

    # -- leg bodies ---------------------------------------------------------------------------
    def _join(self, head: bytes) -> bytes:
        """head is an unterminated JSON object prefix; append the client's other keys."""
        base = self._base
        return head + (b"," + base[1:] if len(base) > 2 else b"}")

    def prefill_body(self) -> bytes:
        return self._join(_PREFILL_CHAT if self.chat else _PREFILL_COMPLETION)

    def decode_body(self, kv: bytes | None) -> bytes:
        """The decode leg, always streamed; a non-streaming client's usage comes from the
        final usage event, so it is asked for."""
        body = self.body
        prefix: dict[str, Any] = {"stream": True}
        if self.stream:
            if "stream_options" in body:
                prefix["stream_options"] = body["stream_options"]
        else:
            prefix["stream_options"] = {"include_usage": True}
        for key in _DECODE_KEYS:
            if key in body:
                prefix[key] = body[key]
        head = dumps(prefix)[:-1]
        if kv is not None:
            head += b',"kv_transfer_params":' + kv
        return self._join(head)

    def release_body(self, kv: bytes) -> bytes:
        """A one-token leg that takes the producer's KV so the producer frees it now: sent
        when the decode leg was refused after the prefill leg had reserved the KV."""
        head = _RELEASE_CHAT if self.chat else _RELEASE_COMPLETION
        return self._join(head + kv)

    def tokenize_body(self) -> bytes:
        key = "messages" if self.chat else "prompt"
        out = {key: self.body[key]}
        if "model" in self.body:
            out["model"] = self.body["model"]
        return dumps(out)

    # -- front.Watcher ------------------------------------------------------------------------
    def client_gone(self) -> None:
        self.gone = True
        if self.relay is not None:
            self.relay.client_gone()

    def cut(self) -> None:
        if self.relay is not None:
            self.relay.cut()

    def pause(self) -> None:
        if self.relay is not None:
            self.relay.pause()

    def resume(self) -> None:
        if self.relay is not None:
            self.relay.resume()

    # -- journal ------------------------------------------------------------------------------
    def row(self) -> dict[str, Any]:
        decision = self.decision
        assert decision is not None and decision.outcome is not None
        return {
            "request_id": self.request_id.decode("ascii"),
            "engine_request_id": self.leg_id.decode("ascii"),
            "received_at": round(self.received, 6),
            "route": self.route,
            "stream": self.stream,
            "tenant": self.tenant,
            "mode": self.mode,
            "prefill_engine": self.prefill_engine,
            "decode_engine": self.decode_engine,
            "decode_attempts": self.decode_attempts,
            "prompt_tokens": self.prompt_tokens,
            "max_tokens": self.max_tokens,
            "events": self.events,
            "prefill_s": self.prefill_s,
            "handoff_s": self.handoff_s,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "total_s": round(time.monotonic() - self.t0, 6),
            "status": self.status,
            "outcome": decision.outcome,
            "rule": decision.name,
            "reason": self.reason or None,
            **({} if self.cached is None else {"cache": self._cache_row()}),
            **({} if self.continued is None else {"continued": self.continued}),
        }

    def _cache_row(self) -> dict[str, Any]:
        """What cache-aware placement saw and did: matched tokens per engine, the hit it
        priced on the computing engine, what that engine reported, how the request ran."""
        placement = self.placement
        return {"matched": self.cached,
                "predicted_hit": placement.cached_tokens if placement is not None else None,
                "observed_hit": self.observed_hit,
                "decision": None if placement is None else "local_cached"
                if placement.cache_local else "plain" if placement.single else "split"}
