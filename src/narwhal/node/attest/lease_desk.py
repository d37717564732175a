"""What the sidecar answers on its lease routes, apart from the HTTP plumbing (server.py).

`GET /v1/lease` is open (holder and epochs are not secret; the key never appears). The three
POST verbs need `Authorization: Bearer <controller key>`, compared by digest in constant time;
their bodies are checked against the closed models in core/lease_wire.py, and a request for
another deployment's fleet is refused before the keeper sees it, so a router pointed at the
wrong sidecars cannot take (or fence) a lease there.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from pydantic import ValidationError

from narwhal.core.document_io import problems_from
from narwhal.core.lease_wire import SCHEMA, VERSION, Claim, Release, Renewal
from narwhal.core.secret import Secret
from narwhal.node.attest.lease import Grant, Holder, Keeper, Refused

NO_LEASE = "this sidecar holds no controller lease (started without --lease-key-file)"
BAD_KEY = ("missing or wrong controller key: send Authorization: Bearer <the key in the "
           "router's controller.quorum.key_file>")
_MODELS: dict[str, type[Release]] = {"acquire": Claim, "renew": Renewal, "release": Release}

Answer = tuple[int, dict[str, Any]]


class LeaseDesk:
    """One sidecar's lease routes over its keeper, for one deployment and one key."""

    def __init__(self, keeper: Keeper, key: Secret, deployment: str) -> None:
        self.keeper = keeper
        self.deployment = deployment
        self._key_digest = hashlib.sha256(key.reveal().encode()).digest()

    def authorized(self, header: str | None) -> bool:
        scheme, _, token = (header or "").partition(" ")
        given = hashlib.sha256(token.strip().encode("utf-8", "replace")).digest()
        # compare_digest on equal-length digests: the time taken says nothing about the key
        return hmac.compare_digest(given, self._key_digest) and scheme.lower() == "bearer"

    def _reply(self, ok: bool, reason: str, error: str = "",
               holder: Grant | None = None) -> dict[str, Any]:
        live, highest, now = self.keeper.state()
        shown = holder if holder is not None else live
        return {"schema": SCHEMA, "schema_version": VERSION, "ok": ok, "reason": reason,
                "error": error, "deployment": self.deployment, "highest_epoch": highest,
                "holder": shown.view(now) if shown is not None else None}

    def state(self) -> Answer:
        return 200, self._reply(True, "state")

    def post(self, verb: str, body: bytes) -> Answer:
        """One authenticated verb; the caller has checked the key and bounded the body."""
        try:
            raw = json.loads(body.decode("utf-8"))
        except UnicodeDecodeError:
            return 400, {"error": "the body is not UTF-8"}
        except json.JSONDecodeError as exc:
            return 400, {"error": f"the body is not JSON ({exc.msg} at byte {exc.pos})"}
        except RecursionError:
            return 400, {"error": "the body is not JSON of a readable depth"}
        if not isinstance(raw, dict):
            return 400, {"error": "the body is not a JSON object"}
        model = _MODELS[verb]
        try:
            request = model.model_validate(raw)  # strict: no "1" for 1, no true for 1, no NaN
        except ValidationError as exc:
            lines = [p.line() for p in problems_from(exc, model,
                                                     reference="docs/controller-lease.md")]
            return 400, {"error": "; ".join(lines), "problems": lines}
        if request.deployment != self.deployment:
            return 409, self._reply(False, "deployment", "sidecar of another deployment "
                                    f"(this one serves {self.deployment!r})")
        try:
            if isinstance(request, Claim):
                grant = self.keeper.acquire(
                    Holder(request.holder_id, request.url, request.pid, request.host),
                    request.epoch, request.ttl_s)
                return 200, self._reply(True, "granted", holder=grant)
            if isinstance(request, Renewal):
                grant = self.keeper.renew(request.holder_id, request.epoch, request.ttl_s)
                return 200, self._reply(True, "granted", holder=grant)
            released = self.keeper.release(request.holder_id, request.epoch)
            return 200, self._reply(True, "released", "" if released else
                                    "not the current grant: nothing to release")
        except Refused as exc:
            return 409, self._reply(False, exc.reason, str(exc), holder=exc.holder)
        except OSError as exc:  # the state file could not be written: nothing was granted
            return 503, {"error": f"cannot record the lease state in "
                         f"{self.keeper.state_path} ({exc.strerror}); nothing changed"}
