"""One lease call from the router to one attestation sidecar, and what its answer means.

Every call is a fresh connection with one timeout for connecting and for each read, and a
bounded reply; whatever goes wrong (refused connection, timeout, a reply that is not the
`narwhal.sidecar-lease` shape, a status the protocol does not use) becomes an `Answer` with no
reply and a sentence saying why, never an exception, so quorum_lease.py counts answers and
never unwinds half a round. The key travels only in the Authorization header.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from narwhal.core.lease_wire import Reply
from narwhal.core.secret import Secret

MAX_REPLY_BYTES = 65_536


@dataclass(frozen=True, slots=True)
class Answer:
    """One sidecar's answer: `reply` for a protocol answer (200 or 409), else `problem`."""

    url: str
    status: int  # 0: no HTTP answer at all
    reply: Reply | None
    problem: str = ""

    @property
    def granted(self) -> bool:
        return self.status == 200 and self.reply is not None and self.reply.ok

    @property
    def refused(self) -> bool:
        return self.status == 409 and self.reply is not None


def call(url: str, verb: str | None, body: dict[str, Any] | None, key: Secret,
         timeout_s: float) -> Answer:
    """GET `url` (verb None) or POST `body` to `url`/`verb`, answering within about timeout_s."""
    parts = urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname or "", parts.port, timeout=timeout_s)
    path = parts.path if verb is None else f"{parts.path}/{verb}"
    try:
        if verb is None:
            conn.request("GET", path)
        else:
            conn.request("POST", path, body=json.dumps(body).encode(), headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {key.reveal()}"})
        response = conn.getresponse()
        status, data = response.status, response.read(MAX_REPLY_BYTES + 1)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        # ValueError: a host name IDNA cannot encode. Nothing may escape: the renewal loop
        # that called this must keep running to fence the router when its lease runs out.
        return Answer(url, 0, None, f"{url} did not answer ({type(exc).__name__}: {exc})")
    finally:
        conn.close()
    if status == 401:
        return Answer(url, status, None, f"{url} refused the router's controller key (401): "
                      "controller.quorum.key_file must hold the key its sidecars were started "
                      "with (--lease-key-file)")
    if status not in (200, 409) or len(data) > MAX_REPLY_BYTES:
        return Answer(url, status, None, f"{url} answered {status} "
                      f"({data[:200].decode('utf-8', 'replace').strip()})")
    try:
        return Answer(url, status, Reply.model_validate_json(data))
    except ValidationError:
        return Answer(url, status, None, f"{url} answered {status} without a "
                      "narwhal.sidecar-lease v1 reply (is it a narwhal-attest sidecar?)")
