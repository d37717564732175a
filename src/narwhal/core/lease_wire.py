"""The controller-lease wire between a router and an attestation sidecar (`narwhal.sidecar-lease` v1).

Three authenticated POST bodies (acquire, renew, release) and one reply shape for every answer,
grants, refusals and `GET /v1/lease` alike, so the router reads every sidecar with one parser.
The bodies are closed: an unknown key is refused rather than ignored, since a misspelt `ttl_s`
would otherwise grant a default the router did not ask for. The bounds below are shared by the
sidecar's keeper, the fleet document (`controller.lease_ttl_s`) and the router.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from narwhal.core.document_io import StrictModel

SCHEMA = "narwhal.sidecar-lease"
VERSION = 1
TTL_MIN_S = 0.2
TTL_MAX_S = 60.0
MAX_BODY_BYTES = 4096  # a claim is a few hundred bytes; anything larger is refused unread
MAX_EPOCH = 2**53  # exact in a JSON number read as a double by any client
VERBS = ("acquire", "renew", "release")

# Why a sidecar refused (HTTP 409): another live holder; an epoch not above the highest it
# has granted; the caller's grant expired (an expired grant is never renewed: acquire a new
# epoch); the holder moved on to a higher epoch; no grant of that holder and epoch at all;
# a request for another deployment's fleet.
Reason = Literal["granted", "released", "state", "held", "stale_epoch", "expired",
                 "superseded", "no_grant", "deployment"]

_Text = Field(min_length=1, max_length=256)


class Release(StrictModel):
    """Give up the grant of `holder_id` at `epoch` (a no-op when it is not the current one)."""

    deployment: str = Field(min_length=1, max_length=128)
    holder_id: str = Field(min_length=1, max_length=256)
    epoch: int = Field(ge=1, le=MAX_EPOCH)


class Renewal(Release):
    """Extend the live grant of `holder_id` at `epoch` by `ttl_s` from its receipt."""

    ttl_s: float = Field(ge=TTL_MIN_S, le=TTL_MAX_S)


class Claim(Renewal):
    """Ask for a grant at `epoch` (above every epoch the sidecar has granted) for `ttl_s`."""

    url: str = Field(min_length=1, max_length=512)
    pid: int = Field(ge=0, le=2**31)
    host: str = _Text


class HolderView(StrictModel):
    """A sidecar's live grant as it shows it: who, which epoch, and how long is left on its clock."""

    holder_id: str
    url: str
    pid: int
    host: str
    epoch: int
    seconds_left: float
    held_s: float  # since the grant at this epoch was made (or restored after a restart)


class Reply(StrictModel):
    """Every answer a sidecar gives on the lease routes (200 and 409 alike)."""

    schema_: Literal["narwhal.sidecar-lease"] = Field(alias="schema")
    schema_version: Literal[1]
    ok: bool
    reason: Reason
    error: str = ""
    deployment: str
    holder: HolderView | None
    highest_epoch: int
