"""The raw HTTP exchanges of one capture, kept in the engine's run dir (http-captures.json).

The capture document holds what was parsed; this holds what the engine answered, so a reader
of the record can check a parse against the bytes it came from, and a failed capture still
shows the status and body that failed it. Each body is kept as received up to a bound (its
full length and sha256 are kept whatever the bound). Credentials are never kept: the engine's
API key travels in the Authorization header, and that header is named, never stored.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterable
from typing import Any

from narwhal.core.documents import sha256_bytes, stamp

SCHEMA = "narwhal.engine-http-captures"
VERSION = 1
FILE = "http-captures.json"
BODY_LIMIT = 1 << 20  # per body; /metrics of a large vLLM stays well under it
# Header names whose values are credentials: named in the record, their values never written.
NEVER_KEPT = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


def headers(items: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """Headers as sent or received, less credentials: those are listed by name only."""
    kept: dict[str, str] = {}
    withheld = []
    for name, value in items:
        if name.lower() in NEVER_KEPT:
            withheld.append(name)
        else:
            kept[name] = value
    return {"headers": kept, "not_kept": sorted(withheld)}


def body(data: bytes | None, limit: int = BODY_LIMIT) -> dict[str, Any] | None:
    """A body as received: UTF-8 text where it is text, base64 where it is not, cut at
    `limit` bytes (said: `truncated`); its full length and sha256 either way."""
    if data is None:
        return None
    part = data[:limit]
    out: dict[str, Any] = {"bytes": len(data), "sha256": sha256_bytes(data),
                           "truncated": len(data) > limit}
    try:
        out["text"] = part.decode("utf-8")
    except UnicodeDecodeError:
        out["base64"] = base64.b64encode(part).decode("ascii")
    return out


class Exchanges:
    """Every request a capture sends that answers a question (not the health polls), in order."""

    def __init__(self, limit: int = BODY_LIMIT) -> None:
        self.limit = limit
        self.rows: list[dict[str, Any]] = []

    def add(self, what: str, request: tuple[str, str, Iterable[tuple[str, str]], bytes | None],
            reply: tuple[int, Iterable[tuple[str, str]], bytes | None],
            started: float, error: str = "") -> None:
        """One exchange: request (method, url, headers, body), reply (status, headers, body);
        status 0 and `error` when nothing answered."""
        method, url, sent_headers, sent = request
        status, got_headers, got = reply
        self.rows.append({
            "what": what, "at": _iso(started), "elapsed_s": round(time.time() - started, 6),
            "request": {"method": method, "url": url, **headers(sent_headers),
                        "body": body(sent, self.limit)},
            "response": {"status": status, **headers(got_headers),
                         "body": body(got, self.limit)},
            "error": error})

    def document(self, engine: str) -> bytes:
        """The stamped file, as written to the run dir: indented, since people read it."""
        doc = stamp(SCHEMA, VERSION, {"engine": engine, "body_limit_bytes": self.limit,
                                      "exchanges": self.rows})
        return (json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n").encode()
