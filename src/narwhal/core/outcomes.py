"""How an accepted request ended: the router journal's `outcome` and its metrics' label.

The router writes these (serve/router/request/decisions.py decides which); the workstation reads them back:
Gate G's alert rules and dashboards select on them and the trial reconciles the journal by
them. One vocabulary in core/ so the two roles cannot drift apart.
"""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    """Every outcome a journal row can record (the value is what is written)."""

    # Hashed as the string it is, so a member and its plain value are one dict key.
    __hash__ = str.__hash__

    OK = "ok"
    # refused after acceptance, before any leg ran
    NO_ENGINE = "no_engine"
    REFUSED_CAPACITY = "refused_capacity"
    REFUSED_TPOT = "refused_tpot"
    REFUSED_OVER_SHARE = "refused_over_share"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    # an engine answered with an error
    ENGINE_REJECTED = "engine_rejected"
    ENGINE_ERROR = "engine_error"
    PREFILL_BAD_BODY = "prefill_bad_body"
    NO_HANDOFF = "no_handoff"
    # an engine broke or went silent
    PREFILL_FAILED = "prefill_failed"
    PREFILL_TIMEOUT = "prefill_timeout"
    DECODE_FAILED = "decode_failed"
    DECODE_TIMEOUT = "decode_timeout"
    DECODE_FAILED_MIDSTREAM = "decode_failed_midstream"
    # the request ended from this side
    CLIENT_GONE = "client_gone"
    CUT_AT_SHUTDOWN = "cut_at_shutdown"
    ROUTER_ERROR = "router_error"


# Outcomes where an engine or a KV handoff failed the request: what the fleet's alert fires on.
FAILED_ON_ENGINE = frozenset({Outcome.NO_ENGINE, Outcome.PREFILL_FAILED, Outcome.DECODE_FAILED,
                              Outcome.DECODE_FAILED_MIDSTREAM, Outcome.NO_HANDOFF})
