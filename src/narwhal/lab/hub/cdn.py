"""Signed object URLs for the double's CDN origin, as the hub hands out for LFS files.

The hub redirects an LFS download to another origin; the client then drops its token (it
never sends one off the hub), so the object URL itself must carry the permission: an HMAC of
the object and an expiry under a key only this server holds. Pure functions.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from enum import Enum
from urllib.parse import parse_qs

OBJECT_PATH = re.compile(r"^/lfs/([0-9a-f]{64})$")
TTL_S = 3600


class Check(Enum):
    OK = "ok"
    EXPIRED = "expired"
    BAD = "bad"


def _signature(key: bytes, sha256: str, expires: int) -> str:
    return hmac.new(key, f"{sha256}:{expires}".encode(), hashlib.sha256).hexdigest()


def object_url(base: str, key: bytes, sha256: str, now: float) -> str:
    expires = int(now) + TTL_S
    return f"{base}/lfs/{sha256}?expires={expires}&signature={_signature(key, sha256, expires)}"


def check(key: bytes, sha256: str, query: str, now: float) -> Check:
    try:
        fields = parse_qs(query, max_num_fields=16, strict_parsing=False)
    except ValueError:
        return Check.BAD
    expires, signature = fields.get("expires", [""])[0], fields.get("signature", [""])[0]
    if not expires.isdigit() or len(expires) > 12:
        return Check.BAD
    if not hmac.compare_digest(_signature(key, sha256, int(expires)), signature):
        return Check.BAD
    return Check.OK if int(expires) >= now else Check.EXPIRED
