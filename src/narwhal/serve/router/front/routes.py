"""Route table of the router: the OpenAI-compatible front and the operational endpoints.

Requests that are refused here (auth, size, shape, model, capacity, shutdown) are answered at
once with an OpenAI-shaped error and counted by outcome; they are not journaled, because they
were never accepted. Everything that passes becomes a `Call` handed to the proxy.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from narwhal.serve.router.control.leadership import Leadership
from narwhal.serve.router.front.connections import Connections
from narwhal.serve.router.front.front import ClientConnection, Request
from narwhal.serve.router.front.responses import error_body
from narwhal.serve.router.jsonio import dumps
from narwhal.serve.router.observe.journal import Journal
from narwhal.serve.router.observe.metrics import RouterMetrics
from narwhal.serve.router.request.call import BadRequest, Call, check_body, check_tokenize_body
from narwhal.serve.router.request.proxy import Proxy
from narwhal.serve.router.scheduling.engines import Engine, pools
from narwhal.serve.router.scheduling.generation import ProfileBook
from narwhal.serve.router.scheduling.roles import RoleController
from narwhal.serve.router.scheduling.scheduler import CurvePriced
from narwhal.serve.router.settings import RouterSettings

_RID_OK = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-"
_PROM = b"text/plain; version=0.0.4; charset=utf-8"


class Routes:
    """The `front.Handler` of the router."""

    def __init__(self, settings: RouterSettings, proxy: Proxy, engines: Sequence[Engine],
                 metrics: RouterMetrics, journal: Journal, leadership: Leadership,
                 profiles: ProfileBook | None = None,
                 roles: RoleController | None = None) -> None:
        self.settings = settings
        self.roles = roles
        self.proxy = proxy
        self.engines = tuple(engines)
        self.metrics = metrics
        self.journal = journal
        self.lead = leadership
        self.profiles = profiles
        self.draining = False
        self.connections: Connections | None = None
        self.canary: Any = None  # router/canary/probe.Canary when the fleet has kv_canary
        self.started = time.time()
        self._seq = 0
        self._rid_prefix = b"nw-" + os.urandom(5).hex().encode() + b"-"
        self._max_concurrent = settings.limits.max_concurrent
        self._model = settings.model
        self._tenants = settings.tenants
        self._ops = settings.ops
        self._models_body = dumps({"object": "list", "data": [{
            "id": settings.model, "object": "model", "created": int(self.started),
            "owned_by": "narwhal", "root": settings.model, "parent": None}]})
        self._get: dict[bytes, Callable[[ClientConnection, Request], None]] = {
            b"/health": self._health, b"/ready": self._ready, b"/metrics": self._metrics,
            b"/v1/models": self._models, b"/narwhal/state": self._state,
            b"/narwhal/handoff": self._handoff,
        }
        # Operational pages name engines, tenants, queue depths and the lease holder: with
        # tenant keys they need the operator key (fleet: operations; docs/security.md).
        self._ops_paths = frozenset({b"/metrics", b"/narwhal/state", b"/narwhal/handoff"})

    # -- front.Handler ----------------------------------------------------------------------
    def refused(self, status: int) -> None:
        self.metrics.request("http", f"refused_{status}")

    def handle(self, conn: ClientConnection, req: Request) -> None:
        path = req.path
        if path == b"/v1/completions":
            self._completion(conn, req, False)
        elif path == b"/v1/chat/completions":
            self._completion(conn, req, True)
        elif path in self._get:
            if req.method != b"GET":
                self._refuse(conn, req, b"", 405, "use GET on this path", "method_not_allowed",
                             "other", extra=b"allow: GET\r\n")
                return
            if path in self._ops_paths and not self._ops.allows(req.auth):
                self._refuse(conn, req, b"", 401, "this operational endpoint needs the operator "
                             "key ('Authorization: Bearer <key>' from operations.key_env or key_file in the "
                             "fleet document)", "invalid_api_key", "other",
                             extra=b"www-authenticate: Bearer\r\n")
                return
            self._get[path](conn, req)
        elif path == b"/tokenize" or path == b"/detokenize":
            self._tokenize(conn, req)
        else:
            self._refuse(conn, req, b"", 404, f"no route {_printable(path)}; "
                         "this router serves /v1/completions, /v1/chat/completions, /v1/models, "
                         "/tokenize, /detokenize, /health, /ready, /metrics, /narwhal/state and "
                         "/narwhal/handoff", "not_found", "other")

    # -- helpers ----------------------------------------------------------------------------
    def _refuse(self, conn: ClientConnection, req: Request, rid: bytes, status: int, message: str,
                code: str, route: str, *, param: str | None = None, extra: bytes = b"") -> None:
        self.metrics.request(route, code)
        conn.respond(status, error_body(status, message, code=code, param=param), rid,
                     req.keep_alive, extra=extra)

    def _request_id(self, req: Request) -> bytes | None:
        """The client's x-request-id if it is safe to echo and journal, else ''; None if bad.
        The `nw-` prefix is the router's own (`_leg_id`): a journal row's id then says who
        made it."""
        rid = req.request_id
        if rid and (len(rid) > 128 or rid.translate(None, _RID_OK) or rid.startswith(b"nw-")):
            return None
        return rid

    def _leg_id(self) -> bytes:
        """An id only this router makes, for the engine legs and the KV handoff they key.

        A client's x-request-id never reaches an engine: a client that chose another
        request's id (or the one the router would give next) could otherwise collide with
        it in the producer's KV table."""
        self._seq += 1
        return self._rid_prefix + b"%x" % self._seq

    def _tenant(self, req: Request) -> tuple[bool, str | None]:
        if not self._tenants.required:
            return True, None
        scheme, _, token = req.auth.partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            return False, None
        tenant = self._tenants.tenant_for(token.strip())
        return tenant is not None, tenant

    def _unauthorized(self, conn: ClientConnection, req: Request, rid: bytes, route: str) -> None:
        self._refuse(conn, req, rid, 401, "missing or unknown bearer key; send "
                     "'Authorization: Bearer <key>' with a key issued for your tenant",
                     "invalid_api_key", route, extra=b"www-authenticate: Bearer\r\n")

    # -- completion routes ------------------------------------------------------------------
    def _completion(self, conn: ClientConnection, req: Request, chat: bool) -> None:
        route = "chat" if chat else "completions"
        rid = self._request_id(req)
        if rid is None:
            self._refuse(conn, req, b"", 400, "x-request-id must be 1-128 characters from "
                         "A-Z a-z 0-9 . _ : - and not begin with 'nw-' (the router's own ids)",
                         "invalid_request_id", route, param="x-request-id")
            return
        if req.method != b"POST":
            self._refuse(conn, req, rid, 405, "use POST on this path", "method_not_allowed",
                         route, extra=b"allow: POST\r\n")
            return
        ok, tenant = self._tenant(req)
        if not ok:
            self._unauthorized(conn, req, rid, route)
            return
        if self.draining:
            self._refuse(conn, req, rid, 503, "router is shutting down; retry on another router",
                         "shutting_down", route)
            return
        if time.monotonic() >= self.lead.until:
            self._not_leader(conn, req, rid, route)
            return
        if self.proxy.inflight >= self._max_concurrent:
            self._refuse(conn, req, rid, 429, f"router is at its limit of {self._max_concurrent} "
                         "concurrent requests (serving.max_concurrent); retry shortly",
                         "too_many_requests", route, extra=b"retry-after: 1\r\n")
            return
        try:
            body = check_body(req.body, chat, self._model)
        except BadRequest as exc:
            self._refuse(conn, req, rid, exc.status, str(exc), exc.code, route, param=exc.param)
            return
        leg = self._leg_id()
        self.proxy.start(conn, Call(body, chat, rid or leg, tenant, conn, req.keep_alive,
                                    req.http11, self.proxy.estimator, leg_id=leg))

    def _tokenize(self, conn: ClientConnection, req: Request) -> None:
        """vLLM's /tokenize and /detokenize, answered by a healthy engine (clients such as
        `vllm bench serve` align their prompts with it)."""
        route = "tokenize"
        if req.method != b"POST":
            self._refuse(conn, req, b"", 405, "use POST on this path", "method_not_allowed",
                         route, extra=b"allow: POST\r\n")
            return
        ok, _ = self._tenant(req)
        if not ok:
            self._unauthorized(conn, req, b"", route)
            return
        if self.draining:
            self._refuse(conn, req, b"", 503, "router is shutting down; retry on another router",
                         "shutting_down", route)
            return
        try:
            check_tokenize_body(req.body, self._model)
        except BadRequest as exc:
            self._refuse(conn, req, b"", exc.status, str(exc), exc.code, route, param=exc.param)
            return
        self.proxy.forward(conn, req.path, req.body, req.keep_alive)

    def _not_leader(self, conn: ClientConnection, req: Request, rid: bytes, route: str) -> None:
        lead = self.lead
        if lead.role == "standby":
            message = (f"this router is a standby for {lead.standby_of} and places no request "
                       "until it holds the fleet's lease; send requests to the primary")
        else:
            message = ("this router no longer holds the fleet's controller lease "
                       f"({lead.fenced_reason or 'lease not renewed in time'}); retry on the "
                       "router that holds it")
        self._refuse(conn, req, rid, 503, message, "not_leader", route,
                     extra=b"retry-after: 1\r\n")

    # -- operational routes -----------------------------------------------------------------
    def _json(self, conn: ClientConnection, req: Request, status: int, value: Any) -> None:
        conn.respond(status, dumps(value), b"", req.keep_alive)

    def _health(self, conn: ClientConnection, req: Request) -> None:
        self._json(conn, req, 200, {"status": "draining" if self.draining else "ok"})

    def ready(self) -> tuple[bool, str]:
        if self.draining:
            return False, "draining"
        if time.monotonic() >= self.lead.until:
            return False, f"{self.lead.role}: not holding the controller lease"
        if not any(e.serves_prefill and e.placeable for e in self.engines):
            return False, "no admitted engine can take a prefill leg"
        if not any(e.serves_decode and e.placeable for e in self.engines):
            return False, "no admitted engine can take a decode leg"
        return True, "ready"

    def _ready(self, conn: ClientConnection, req: Request) -> None:
        ok, why = self.ready()
        self._json(conn, req, 200 if ok else 503, {"ready": ok, "reason": why})

    def _metrics(self, conn: ClientConnection, req: Request) -> None:
        conn.respond(200, self.metrics.render(), b"", req.keep_alive, content_type=_PROM)

    def _models(self, conn: ClientConnection, req: Request) -> None:
        ok, _ = self._tenant(req)
        if not ok:
            self._unauthorized(conn, req, b"", "models")
            return
        conn.respond(200, self._models_body, b"", req.keep_alive)

    def _handoff(self, conn: ClientConnection, req: Request) -> None:
        self._json(conn, req, 200, self.lead.handoff())

    def _state(self, conn: ClientConnection, req: Request) -> None:
        ready, why = self.ready()
        self._json(conn, req, 200, {
            "model": self._model,
            "ready": ready,
            "reason": why,
            "draining": self.draining,
            "controller": self.lead.state(),
            "profiles": self.profiles.state() if self.profiles is not None else None,
            "inflight": self.proxy.inflight,
            "served": self.proxy.served,
            "prompt_estimate": self.proxy.estimator.state(),
            "pools": pools(self.engines),
            "engines": [e.state() for e in self.engines],
            "scheduler": (chooser.state() if isinstance(chooser := self.proxy.chooser, CurvePriced)
                          else {"policy": "least_outstanding"}),
            "role_flips": self.roles.state() if self.roles is not None else None,
            "prefix_cache": self.proxy.cache.state() if self.proxy.cache is not None else None,
            "kv_canary": self.canary.state() if self.canary is not None else None,
            "journal": {"path": str(self.journal.path), "written": self.journal.written,
                        "dropped": self.journal.dropped, "queued": self.journal.queued},
            "connections": self.connections.state() if self.connections is not None else None,
        })


def _printable(path: bytes) -> str:
    """A client's path for an error message: ASCII only, at most 200 characters."""
    return path[:200].decode("ascii", "replace").encode("ascii", "replace").decode("ascii")
