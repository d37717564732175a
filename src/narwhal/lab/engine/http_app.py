"""The aiohttp application: vLLM's routes, its error shapes, uvicorn's access log, /emu admin.

No middleware: each route is wrapped once, at startup, by `_guarded`, which turns an `ApiError`
into vLLM's JSON error. Unknown paths answer FastAPI's `{"detail": "Not Found"}` and a known
path with the wrong method `{"detail": "Method Not Allowed"}`, as vLLM's server does.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from narwhal.lab.engine import responses as R
from narwhal.lab.engine.engine import Engine
from narwhal.lab.engine.faults import FaultCommand
from narwhal.lab.engine.logs import uvicorn
from narwhal.lab.engine.openai_api import OpenAIRoutes, api_error_response
from narwhal.lab.engine.protocol import (
    ApiError,
    DetokenizeBody,
    TokenizeBody,
    bad_request,
    not_found_model,
    parse_body,
)
from narwhal.lab.engine.tokenizer import render_chat

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
CRASH_DELAY = 0.05  # seconds: long enough to answer the admin call
KNOWN_PATHS = web.AppKey("known_paths", frozenset[str])


def _die(code: int) -> None:
    logging.shutdown()
    os._exit(code)


def _guarded(handler: Handler) -> Handler:
    async def run(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as error:
            return api_error_response(error)

    return run


class UvicornAccessLogger(AbstractAccessLogger):
    """`INFO:     127.0.0.1:5000 - "POST /v1/completions HTTP/1.1" 200 OK`."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        client = f"{peer[0]}:{peer[1]}" if peer else "-"
        version = f"{request.version.major}.{request.version.minor}"
        self.logger.info('%s - "%s %s HTTP/%s" %d %s', client, request.method, request.path_qs,
                         version, response.status, response.reason, extra=uvicorn())


class EngineServer:
    """Request-independent HTTP state: names, auth, the admin token, the hang gate."""

    def __init__(self, engine: Engine, log: logging.Logger) -> None:
        self.engine = engine
        self.cfg = engine.cfg
        self.faults = engine.faults
        self.log = log
        self.created = int(time.time())
        self._api_key = self.cfg.serve.api_key
        self._admin_token = self.cfg.emu.admin_token
        self._id_headers = self.cfg.serve.request_id_headers
        self.openai = OpenAIRoutes(engine, self)

    # -- used by every route ------------------------------------------------------------------
    async def admit(self, request: web.Request) -> None:
        """Hang while the hang fault is on; enforce --api-key on /v1 routes."""
        gate = self.faults.hang_gate()
        if gate is not None:
            await gate
        if self._api_key and request.path.startswith("/v1"):
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self._api_key}".encode()):
                raise ApiError(401, "Unauthorized", "Unauthorized")

    @property
    def served(self) -> tuple[str, ...]:
        wrong = self.faults.wrong_model
        return (wrong,) if wrong else self.cfg.served_model_names

    def check_model(self, name: str | None) -> str:
        """The name responses carry (the first served name); 404 for a name not served."""
        served = self.served
        if name is not None and name not in served:
            raise not_found_model(name, served)
        return served[0]

    def response_headers(self, request_id: str) -> dict[str, str]:
        return {"X-Request-Id": request_id} if self._id_headers else {}

    # -- plain routes --------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.StreamResponse:
        await self.admit(request)
        return web.Response(status=503 if self.engine.dead else 200)

    async def version(self, request: web.Request) -> web.StreamResponse:
        await self.admit(request)
        return self._json({"version": self.cfg.vllm_version})

    async def models(self, request: web.Request) -> web.StreamResponse:
        await self.admit(request)
        data = [self._model_card(name) for name in self.served]
        return self._json({"object": "list", "data": data})

    def _model_card(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": self.created, "owned_by": "vllm",
                "root": self.cfg.model, "parent": None,
                "max_model_len": self.engine.plan.max_model_len,
                "permission": [{
                    "id": f"modelperm-{os.urandom(16).hex()}", "object": "model_permission",
                    "created": self.created, "allow_create_engine": False,
                    "allow_sampling": True, "allow_logprobs": True,
                    "allow_search_indices": False, "allow_view": True,
                    "allow_fine_tuning": False, "organization": "*", "group": None,
                    "is_blocking": False}]}

    async def tokenize(self, request: web.Request) -> web.StreamResponse:
        await self.admit(request)
        body = parse_body(await request.read(), TokenizeBody)
        self.check_model(body.model)
        tok = self.engine.tokenizer
        if body.messages is not None:
            text = render_chat(body.messages, tok.special, body.add_generation_prompt,
                               body.continue_final_message, self.cfg.serve.response_role)
            add = bool(body.add_special_tokens) if body.add_special_tokens is not None else False
        elif body.prompt is not None:
            text = body.prompt
            add = body.add_special_tokens if body.add_special_tokens is not None else True
        else:
            raise bad_request("Either prompt or messages must be provided.", "prompt")
        ids = tok.encode(text, add_special_tokens=add)
        strs = [tok.token_str(t) for t in ids] if body.return_token_strs else None
        return self._json({"count": len(ids), "max_model_len": self.engine.plan.max_model_len,
                           "tokens": ids, "token_strs": strs})

    async def detokenize(self, request: web.Request) -> web.StreamResponse:
        await self.admit(request)
        body = parse_body(await request.read(), DetokenizeBody)
        self.check_model(body.model)
        tok = self.engine.tokenizer
        for token in body.tokens:
            if not tok.in_vocab(token):
                raise bad_request(f"Token id {token} is out of vocabulary", "tokens", token)
        return self._json({"prompt": tok.decode(body.tokens)})

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        await self.admit(request)
        return web.Response(body=self.engine.metrics.render(),
                            headers={"Content-Type": METRICS_TYPE})

    async def load(self, request: web.Request) -> web.StreamResponse:
        await self.admit(request)
        s = self.engine.scheduler
        return self._json({"server_load": len(s.running) + len(s.waiting)})

    async def reset_prefix_cache(self, request: web.Request) -> web.StreamResponse:
        await self.admit(request)
        self.engine.prefix_cache.reset()
        return web.Response(status=200)

    # -- emulator admin ------------------------------------------------------------------------
    def _check_admin(self, request: web.Request) -> None:
        if self._admin_token is None:
            return
        given = request.headers.get("X-Emu-Admin-Token", "")
        if not hmac.compare_digest(given.encode(), self._admin_token.encode()):
            raise ApiError(401, "missing or wrong X-Emu-Admin-Token", "Unauthorized")

    async def fault(self, request: web.Request) -> web.StreamResponse:
        self._check_admin(request)
        command = parse_body(await request.read(), FaultCommand)
        if command.fault == "crash":
            # Answer the admin call, then die without cleanup, as a dead engine core does.
            self.log.error("EngineCore encountered a fatal error (emulated crash).")
            asyncio.get_running_loop().call_later(CRASH_DELAY, _die, command.exit_code)
            return self._json({"faults": self.faults.snapshot(), "crashing": True})
        self.faults.apply(command)
        self.engine.timing.factor = self.faults.slow_factor
        self.log.warning("emulator fault %s applied: %s", command.fault, self.faults.snapshot())
        return self._json({"faults": self.faults.snapshot()})

    async def state(self, request: web.Request) -> web.StreamResponse:
        self._check_admin(request)
        connector = self.engine.connector
        return self._json({
            "faults": self.faults.snapshot(), "scheduler": self.engine.state(),
            "pid": os.getpid(), "engine_id": self.cfg.engine_id,
            "served_model_names": list(self.served),
            "side_channel_port": connector.side_channel_port if connector else None,
            "kv_connector": connector is not None})

    async def not_found(self, request: web.Request) -> web.StreamResponse:
        known = request.app[KNOWN_PATHS]
        if request.path in known:
            return self._json({"detail": "Method Not Allowed"}, 405)
        return self._json({"detail": "Not Found"}, 404)

    @staticmethod
    def _json(obj: dict[str, Any], status: int = 200) -> web.Response:
        return web.Response(status=status, body=R.body(obj), content_type="application/json")


def build_app(server: EngineServer, dev_mode: bool) -> web.Application:
    """The routes, each wrapped once; a catch-all last for FastAPI-style 404/405."""
    app = web.Application(client_max_size=64 * 2**20)
    routes: list[tuple[str, str, Handler]] = [
        ("GET", "/health", server.health),
        ("GET", "/ping", server.health),
        ("GET", "/version", server.version),
        ("GET", "/v1/models", server.models),
        ("GET", "/metrics", server.metrics),
        ("GET", "/load", server.load),
        ("POST", "/tokenize", server.tokenize),
        ("POST", "/detokenize", server.detokenize),
        ("POST", "/v1/completions", server.openai.completions),
        ("POST", "/v1/chat/completions", server.openai.chat),
        ("POST", "/emu/fault", server.fault),
        ("GET", "/emu/state", server.state),
    ]
    if dev_mode:
        routes.append(("POST", "/reset_prefix_cache", server.reset_prefix_cache))
    for method, path, handler in routes:
        app.router.add_route(method, path, _guarded(handler))
    app[KNOWN_PATHS] = frozenset(path for _, path, _ in routes)
    app.router.add_route("*", "/{tail:.*}", server.not_found)
    return app
