"""A small blocking HTTP client for the fidelity checks: status, body, and SSE events.

Stdlib only, so the same checks run from any tier's test process against any engine (real
vLLM, the emulator) without an event loop. Non-2xx replies are returned, not raised: error
shapes are part of what the checks compare.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Reply:
    """One HTTP reply: status, content type and the raw body."""

    status: int
    content_type: str
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def request(method: str, url: str, body: Any = None, *, raw: bytes | None = None,
            timeout: float = TIMEOUT_S) -> Reply:
    """Send one request; `body` is JSON-encoded, `raw` is sent as is (for malformed bodies)."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"not an engine URL: {url!r}")
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    headers = {"content-type": "application/json"} if data is not None else {}
    req = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
            return Reply(resp.status, resp.headers.get("content-type", ""), resp.read())
    except urllib.error.HTTPError as err:
        return Reply(err.code, err.headers.get("content-type", ""), err.read())


def get(url: str, *, timeout: float = TIMEOUT_S) -> Reply:
    return request("GET", url, timeout=timeout)


def post(url: str, body: Any, *, timeout: float = TIMEOUT_S) -> Reply:
    return request("POST", url, body, timeout=timeout)


def sse_events(text: str) -> list[str]:
    """The `data:` payloads of an SSE body, in order (the final `[DONE]` included)."""
    events: list[str] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = [line[len("data:"):].lstrip() for line in block.split("\n")
                 if line.startswith("data:")]
        if lines:
            events.append("\n".join(lines))
    return events
