"""What an attestation sidecar's answer means for the fleet's contract.

The router (serve/router/control/attestation.py, which holds an engine out) and `narwhal status`
(deploy/gates/restarts.py, which names the work to repeat) read the same answers; this is the
one reading both use, so an answer never means one thing to the router and another to the
operator. A 503 carries the sidecar's own words for people (`error`) and a machine field for
readers (`kind`, one of REFUSAL_KINDS): the two kinds that say the engine itself changed (its
process, or its cache layout) are told apart, since those need a new capture first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

# Why a sidecar refuses to vouch (its 503's `kind`, node/attest/document.py raises each):
#   process_changed  the attested container or process is gone, or another one started
#   layout_changed   the engine's cache_config_info is not the attested capture's
#   unreadable       the engine's live state cannot be read (its /metrics does not answer,
#                    or does not parse), so the sidecar cannot tell whether it changed
RefusalKind = Literal["process_changed", "layout_changed", "unreadable"]
REFUSAL_KINDS: tuple[RefusalKind, ...] = get_args(RefusalKind)
ENGINE_CHANGED: frozenset[str] = frozenset({"process_changed", "layout_changed"})


@dataclass(frozen=True)
class Reading:
    reason: str  # why the answer does not vouch for the contract; "" when it does
    process_changed: bool  # the engine is not the process Gate C captured


def refusal(kind: RefusalKind, error: str, engine: str, attested_digest: str
            ) -> dict[str, str]:
    """The body of a sidecar's 503: the machine `kind` and the prose `error` operators read."""
    return {"kind": kind, "error": error, "engine": engine, "attested_digest": attested_digest}


def read_answer(status: int, body: object, digest: str,
                compatibility_hash: str | None = None) -> Reading:
    """The sidecar's answer (HTTP status and parsed body) against the contract's attestation
    digest (and compatibility hash, when the reader holds it)."""
    if not isinstance(body, dict):
        return Reading(f"the sidecar answered {status} without a JSON object", False)
    if status == 503:
        error = str(body.get("error", "")).strip()[:300]
        # A 503 without a known kind (a sidecar of another revision) is read as "not shown to
        # have changed": that sends the operator to `narwhal attest`, which holds the engine
        # to Gate C's capture and names a new capture itself if one is needed, whereas a
        # wrong "changed" would send them to recapture or restart an engine that may be fine.
        # Either way the engine is held out: the answer does not vouch.
        kind = body.get("kind")
        return Reading(error or "the sidecar refuses without a reason",
                       isinstance(kind, str) and kind in ENGINE_CHANGED)
    if status != 200:
        return Reading(f"the sidecar answered {status}", False)
    got = str(body.get("digest"))
    if got != digest:
        return Reading(f"attestation {got[:19]} is not the fleet's contract {digest[:19]}: run "
                       "`narwhal attest`", False)
    if compatibility_hash is not None and body.get("compatibility_hash") != compatibility_hash:
        return Reading("the attested compatibility hash is not the fleet's contract", False)
    return Reading("", False)
