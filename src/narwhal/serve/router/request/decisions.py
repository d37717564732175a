"""The router's decisions where a request's path forks: one table, which the proxy carries out.

Why a table: when a leg ends, four things are decided together (what the engine's health
learns, whether the leg is sent again and where, what the client is told, which outcome is
counted and journaled), and decided in several places the rules drifted apart (a prefill
timeout was never retried while a decode one was; a prefill 5xx reached the client while a
decode 5xx was retried). Here each case is one row, looked up without I/O or a clock, so a
unit test walks every case; the proxy only executes the row it is given, and every journal
row names the rule that settled it (`rule`).

A leg end is looked up by (leg, how it ended, facts): the facts are a few bits the proxy
reads off the call (`STALE`, `RETRY_OK`, `STREAMING`, `STARTED`, `OVERFLOW_POSSIBLE`,
`GONE`, `CONTINUABLE`). The first row whose required bits are all set wins. Settlements that are not a leg's end (a
refusal at placement, a client gone between legs, a handoff the producer did not give) are
named Decisions too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

from narwhal.core.outcomes import Outcome

# Legs
PREFILL: Final = "prefill"
DECODE: Final = "decode"

# How a leg ended (legs.Collector's and relay.DecodeRelay's results, the answer's status split)
ANSWERED: Final = "answered"  # 200
REJECTED: Final = "rejected"  # the engine answered another status below 500
ENGINE_5XX: Final = "engine_5xx"
FAILED_BEFORE: Final = "failed_before"  # broke before any byte reached the client
TIMEOUT_BEFORE: Final = "timeout_before"
FAILED_MID: Final = "failed_mid"  # broke after the client saw bytes
TIMEOUT_MID: Final = "timeout_mid"
CLIENT_GONE: Final = "client_gone"
CUT: Final = "cut"  # shutdown's drain bound ran out

def answered(status: int) -> str:
    """How a leg the engine answered ended, by its status."""
    return ANSWERED if status == 200 else REJECTED if status < 500 else ENGINE_5XX


# What each leg's sink can report: a prefill leg is never seen by the client, nor cut.
ENDS: Final = {PREFILL: (ANSWERED, REJECTED, ENGINE_5XX, FAILED_BEFORE, TIMEOUT_BEFORE),
               DECODE: (ANSWERED, REJECTED, ENGINE_5XX, FAILED_BEFORE, TIMEOUT_BEFORE,
                        FAILED_MID, TIMEOUT_MID, CLIENT_GONE, CUT)}

# Facts (bits)
STALE: Final = 1  # broke on a reused keep-alive connection before any response byte, first send
RETRY_OK: Final = 2  # tries left, the client still there, the router not shutting down
STREAMING: Final = 4  # the client asked for a stream
STARTED: Final = 8  # the client's response began (its head went out with the first byte)
OVERFLOW_POSSIBLE: Final = 16  # a 400 while the prompt is uncounted: maybe prompt + max_tokens > context
GONE: Final = 32  # the client connection has closed
CONTINUABLE: Final = 64  # the client holds a clean part of the answer a new request can extend
FACT_BITS: Final = 128
MAX_TRIES: Final = 3  # engines a leg is sent to, at most

# What the health tracker learns
HEALTH_NONE: Final = ""
HEALTH_OK: Final = "ok"
HEALTH_FAILED: Final = "failed"  # counts towards ejection (health.py)
HEALTH_SUSPECT: Final = "suspect"  # probe the engine now

# How the client is answered
PROCEED: Final = "proceed"  # the leg did its part: go on (hand off, or reply with the result)
ERROR: Final = "error"  # an OpenAI-shaped error with `status` and `code`
BODY: Final = "body"  # a body the proxy has: the engine's own 4xx as it wrote it, or the reply
END_STREAM: Final = "end_stream"  # the stream already carries its end (or error event): finish it
CLOSE: Final = "close"  # close the client connection


@dataclass(frozen=True, slots=True)
class Decision:
    """One row: what the proxy does. `outcome` None means the leg succeeded and the request
    goes on. With `again` or `retry` the leg is sent once more (the same engine on a new
    connection; another engine, if the chooser has one); otherwise, or when no engine is
    left, the request settles as the rest of the row says."""

    name: str
    outcome: Outcome | None
    status: int = 0  # to the client; 0 = the engine's own status
    code: str = ""
    message: str = ""  # str.format template: engine, reason, status, timeout, detail; the
    # journal's `reason`
    reply: str = ERROR
    health: str = HEALTH_NONE
    again: bool = False
    retry: bool = False
    explain: bool = False  # count the prompt first: a context overflow is said in the client's numbers
    release_kv: bool = False  # the producer holds KV no decode leg will read: have it taken
    resume: bool = False  # continue the answer on another engine (continuation.py)


def _err(name: str, outcome: Outcome, status: int, code: str, message: str, *,
         health: str = HEALTH_NONE, retry: bool = False, release_kv: bool = False) -> Decision:
    """A row whose client gets an OpenAI-shaped error."""
    return Decision(name, outcome, status, code, message, ERROR, health=health, retry=retry,
                    release_kv=release_kv)


# -- settlements that are not a leg's end -------------------------------------------------------
NO_ENGINE = _err("no_engine", Outcome.NO_ENGINE, 503, "no_engine",
                 "no healthy engine can serve this request now")
REFUSED_CAPACITY = _err("refused_capacity", Outcome.REFUSED_CAPACITY, 429, "over_capacity",
                        "{detail}")
REFUSED_TPOT = _err("refused_tpot", Outcome.REFUSED_TPOT, 429, "over_capacity", "{detail}")
REFUSED_OVER_SHARE = _err("refused_over_share", Outcome.REFUSED_OVER_SHARE, 429,
                          "over_fair_share", "{detail}")
CONTEXT_TOO_LONG = _err("context_too_long", Outcome.CONTEXT_LENGTH_EXCEEDED, 400,
                        "context_length_exceeded", "{detail}", release_kv=True)
PREFILL_BAD_BODY = _err("prefill_bad_body", Outcome.PREFILL_BAD_BODY, 502, "engine_error",
                        "prefill engine {engine} answered with a body that is not a completion")
NO_HANDOFF = _err("no_handoff", Outcome.NO_HANDOFF, 502, "no_handoff",
                  "prefill engine {engine} returned no kv_transfer_params; start it with a KV "
                  "connector (kv_role kv_producer or kv_both)")
GONE_BEFORE_PREFILL = Decision("gone_before_prefill", Outcome.CLIENT_GONE, 499, "",
                               "client connection closed before the prefill leg", CLOSE)
GONE_BEFORE_DECODE = Decision("gone_before_decode", Outcome.CLIENT_GONE, 499, "",
                              "client connection closed before the decode leg", CLOSE,
                              release_kv=True)
# A buffered reply's stream ended in an error event (its status) or could not be read (502).
STREAM_UNREADABLE = _err("stream_unreadable", Outcome.ENGINE_ERROR, 0, "engine_error", "{detail}")
ROUTER_ERROR = _err("router_error", Outcome.ROUTER_ERROR, 500, "router_error",
                    "router error: {detail}")
REPLIED = Decision("replied", Outcome.OK, 200, reply=BODY)  # a buffered reply, reassembled

# The refusal each admission verdict settles with, by `Refusal.kind` (engines.py); admission.py
# checks at import that every kind it can produce has one.
REFUSALS: Final = {"capacity": REFUSED_CAPACITY, "over_share": REFUSED_OVER_SHARE,
                   "tpot": REFUSED_TPOT}

SETTLEMENTS: Final = (NO_ENGINE, REFUSED_CAPACITY, REFUSED_TPOT, REFUSED_OVER_SHARE,
                      CONTEXT_TOO_LONG, PREFILL_BAD_BODY, NO_HANDOFF, GONE_BEFORE_PREFILL,
                      GONE_BEFORE_DECODE, STREAM_UNREADABLE, ROUTER_ERROR, REPLIED)


@dataclass(frozen=True, slots=True)
class Row:
    """A leg end and the fact bits it needs, and the decision for it."""

    leg: str
    end: str
    needs: int
    decision: Decision


# -- leg ends: the first row whose needed bits are set wins --------------------------------------
ROWS: Final = (
    # The engine had closed an idle keep-alive connection: no fault of its own, whether or not
    # the client is still there (counted against the engine, a client that leaves at the
    # wrong moment would move a healthy engine towards ejection). The leg is sent again on a
    # new connection, unless its client has left.
    Row(PREFILL, FAILED_BEFORE, STALE | GONE, Decision(
        "prefill/stale_connection_client_gone", Outcome.CLIENT_GONE, 499, "",
        "client connection closed; the prefill engine had closed the idle connection the "
        "leg was sent on", CLOSE)),
    Row(DECODE, FAILED_BEFORE, STALE | GONE, Decision(
        "decode/stale_connection_client_gone", Outcome.CLIENT_GONE, 499, "",
        "client connection closed; the decode engine had closed the idle connection the "
        "leg was sent on", CLOSE,
        release_kv=True)),
    Row(PREFILL, FAILED_BEFORE, STALE, Decision("prefill/stale_connection", None, again=True)),
    Row(DECODE, FAILED_BEFORE, STALE, Decision("decode/stale_connection", None, again=True)),
    # Nothing reached the client: another engine may answer, on either leg alike.
    Row(PREFILL, FAILED_BEFORE, 0, _err(
        "prefill/failed", Outcome.PREFILL_FAILED, 502, "engine_unreachable",
        "prefill engine {engine} failed: {reason}", health=HEALTH_FAILED, retry=True)),
    Row(DECODE, FAILED_BEFORE, 0, _err(
        "decode/failed", Outcome.DECODE_FAILED, 502, "engine_unreachable",
        "decode engine {engine} failed: {reason}", health=HEALTH_FAILED, retry=True,
        release_kv=True)),
    Row(PREFILL, TIMEOUT_BEFORE, 0, _err(
        "prefill/timeout", Outcome.PREFILL_TIMEOUT, 504, "engine_timeout",
        "prefill engine {engine} did not answer within {timeout:g} s", health=HEALTH_SUSPECT,
        retry=True)),
    Row(DECODE, TIMEOUT_BEFORE, 0, _err(
        "decode/timeout", Outcome.DECODE_TIMEOUT, 504, "engine_timeout",
        "decode engine {engine} timed out: {reason}", health=HEALTH_SUSPECT, retry=True,
        release_kv=True)),
    Row(PREFILL, ENGINE_5XX, 0, _err(
        "prefill/engine_5xx", Outcome.ENGINE_ERROR, 502, "engine_error",
        "prefill engine {engine} answered {status}: {reason}", retry=True)),
    Row(DECODE, ENGINE_5XX, 0, _err(
        "decode/engine_5xx", Outcome.ENGINE_ERROR, 502, "engine_error",
        "decode engine {engine} answered {status}: {reason}", retry=True)),
    # The engine answered: it is alive.
    Row(PREFILL, ANSWERED, 0, Decision("prefill/answered", None, reply=PROCEED,
                                       health=HEALTH_OK)),
    Row(DECODE, ANSWERED, STREAMING, Decision("decode/answered", Outcome.OK, 200, "", "",
                                              END_STREAM, health=HEALTH_OK)),
    # A buffered reply is reassembled from the stream first (REPLIED, or STREAM_UNREADABLE).
    Row(DECODE, ANSWERED, 0, Decision("decode/answered_buffered", None, reply=PROCEED,
                                      health=HEALTH_OK)),
    Row(PREFILL, REJECTED, OVERFLOW_POSSIBLE, Decision(
        "prefill/rejected_uncounted", None, reply=PROCEED, health=HEALTH_OK, explain=True)),
    # The engine's own 4xx reaches the client as it wrote it; a decode engine that refused
    # never read the KV, so the producer is asked to free it.
    Row(PREFILL, REJECTED, 0, Decision(
        "prefill/rejected", Outcome.ENGINE_REJECTED, 0, "engine_rejected",
        "prefill engine {engine} answered {status}", BODY, health=HEALTH_OK)),
    Row(DECODE, REJECTED, 0, Decision(
        "decode/rejected", Outcome.ENGINE_REJECTED, 0, "engine_rejected",
        "decode engine {engine} answered {status}", BODY, health=HEALTH_OK,
        release_kv=True)),
    # The client already has part of the answer and a new request can extend it: another
    # engine continues from the prompt plus that part (when no engine is left, the rows
    # below settle it).
    Row(DECODE, FAILED_MID, CONTINUABLE | RETRY_OK, Decision(
        "decode/failed_midstream_continue", None, health=HEALTH_FAILED, resume=True)),
    Row(DECODE, TIMEOUT_MID, CONTINUABLE | RETRY_OK, Decision(
        "decode/stalled_midstream_continue", None, health=HEALTH_SUSPECT, resume=True)),
    # Otherwise a stream ends with the error event the relay owes it; a buffered reply
    # becomes an error.
    Row(DECODE, FAILED_MID, STREAMING, Decision(
        "decode/failed_midstream", Outcome.DECODE_FAILED_MIDSTREAM, 200, "",
        "decode engine {engine}: {reason}", END_STREAM, health=HEALTH_FAILED)),
    Row(DECODE, FAILED_MID, 0, _err(
        "decode/failed_mid_leg", Outcome.DECODE_FAILED_MIDSTREAM, 502, "engine_failed",
        "decode engine {engine} failed mid-leg: {reason}", health=HEALTH_FAILED)),
    Row(DECODE, TIMEOUT_MID, STREAMING, Decision(
        "decode/timeout_midstream", Outcome.DECODE_TIMEOUT, 200, "",
        "decode engine {engine}: {reason}", END_STREAM, health=HEALTH_SUSPECT)),
    Row(DECODE, TIMEOUT_MID, 0, _err(
        "decode/timeout_mid_leg", Outcome.DECODE_TIMEOUT, 502, "engine_failed",
        "decode engine {engine} failed mid-leg: {reason}", health=HEALTH_SUSPECT)),
    Row(DECODE, CLIENT_GONE, 0, Decision("decode/client_gone", Outcome.CLIENT_GONE, 499, "",
                                         "{reason}", CLOSE)),
    Row(DECODE, CUT, STREAMING | STARTED, Decision(
        "decode/cut_midstream", Outcome.CUT_AT_SHUTDOWN, 200, "", "{reason}", CLOSE)),
    Row(DECODE, CUT, 0, _err("decode/cut", Outcome.CUT_AT_SHUTDOWN, 503, "router_shutdown",
                             "{reason}")),
)


def _build() -> dict[tuple[str, str, int], Decision]:
    table: dict[tuple[str, str, int], Decision] = {}
    for leg, ends in ENDS.items():
        for end in ends:
            for facts in range(FACT_BITS):
                row = next((r for r in ROWS if r.leg == leg and r.end == end
                            and r.needs & facts == r.needs), None)
                if row is None:
                    raise AssertionError(f"no rule for a {leg} leg ending {end}")
                d = row.decision
                if d.retry and not facts & RETRY_OK:
                    d = replace(d, retry=False)
                table[(leg, end, facts)] = d
    return table


TABLE: Final = _build()


def decide(leg: str, end: str, facts: int) -> Decision:
    """The row for a leg that ended so (KeyError for an end its sink cannot report)."""
    return TABLE[(leg, end, facts)]


def at_shutdown(decision: Decision) -> Decision:
    """Shutdown cut the drain short: whatever else ended a request then is counted as cut."""
    if decision.outcome in (None, Outcome.OK, Outcome.CUT_AT_SHUTDOWN):
        return decision
    return _SHUTDOWN[decision.name]


def every_decision() -> dict[str, Decision]:
    """Every rule by name: the leg ends, the settlements, and their shutdown variants."""
    named = {d.name: d for d in (*TABLE.values(), *SETTLEMENTS)}
    return named | {d.name: d for d in _SHUTDOWN.values()}


_SHUTDOWN: Final = {d.name: replace(d, name=f"{d.name}@shutdown", outcome=Outcome.CUT_AT_SHUTDOWN)
                    for d in (*TABLE.values(), *SETTLEMENTS)
                    if d.outcome is not None and d.outcome not in (Outcome.OK,
                                                                   Outcome.CUT_AT_SHUTDOWN)}
