"""What an attestation sidecar's answer means for the fleet's contract.

The router (serve/router/control/attestation.py, which holds an engine out) and `narwhal status`
(deploy/gates/restarts.py, which names the work to repeat) read the same answers; this is the
one reading both use, so an answer never means one thing to the router and another to the
operator. A 503 carries the sidecar's own words; the two that say the engine itself changed
(its process, or its cache layout) are told apart, since those need a new capture first.
"""

from __future__ import annotations

from dataclasses import dataclass

PROCESS_CHANGES = ("engine process changed", "layout changed")


@dataclass(frozen=True)
class Reading:
    reason: str  # why the answer does not vouch for the contract; "" when it does
    process_changed: bool  # the engine is not the process Gate C captured


def read_answer(status: int, body: object, digest: str,
                compatibility_hash: str | None = None) -> Reading:
    """The sidecar's answer (HTTP status and parsed body) against the contract's attestation
    digest (and compatibility hash, when the reader holds it)."""
    if not isinstance(body, dict):
        return Reading(f"the sidecar answered {status} without a JSON object", False)
    if status == 503:
        error = str(body.get("error", "")).strip()[:300]
        return Reading(error or "the sidecar refuses without a reason",
                       error.startswith(PROCESS_CHANGES))
    if status != 200:
        return Reading(f"the sidecar answered {status}", False)
    got = str(body.get("digest"))
    if got != digest:
        return Reading(f"attestation {got[:19]} is not the fleet's contract {digest[:19]}: run "
                       "`narwhal attest`", False)
    if compatibility_hash is not None and body.get("compatibility_hash") != compatibility_hash:
        return Reading("the attested compatibility hash is not the fleet's contract", False)
    return Reading("", False)
