"""/v1/completions and /v1/chat/completions: validation, then the engine, then vLLM's shapes.

Request checks follow vLLM's order: body schema (400 `Bad Request`), model name (404), then
parameters and prompt length (400 `BadRequestError` naming the parameter). A streamed response
sends its headers before the engine runs, as vLLM's StreamingResponse does, so a KV load
failure there arrives as an SSE error event; unstreamed, it is HTTP 500 `Internal server error`.
A dead engine core (engine.py) fails every request the same two ways with vLLM's
EngineDeadError message instead.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from narwhal.lab.engine import responses as R
from narwhal.lab.engine.engine import ENGINE_DEAD_MESSAGE, Engine, EngineDead, Run, Sampling
from narwhal.lab.engine.nixl.api import KvLoadFailed
from narwhal.lab.engine.protocol import (
    ApiError,
    ChatBody,
    CommonBody,
    CompletionBody,
    bad_request,
    engine_dead_error,
    internal_error,
    parse_body,
)
from narwhal.lab.engine.tokenizer import render_chat

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


@dataclass(frozen=True)
class Job:
    """One validated generation request."""

    chat: bool
    head: R.Head
    prompt_ids: list[int]
    sampling: Sampling
    stream: bool
    include_usage: bool
    continuous_usage: bool
    return_token_ids: bool
    interval: int
    logprobs: int | None  # completions: top-N; chat: top_logprobs when logprobs=true
    role: str
    prompt_text: str | None = None  # chat with return_prompt_text: the rendered prompt


class OpenAIRoutes:
    """The two generation routes; `served` and `check_model` come from the HTTP app."""

    def __init__(self, engine: Engine, server: Any) -> None:
        self.engine = engine
        self.tok = engine.tokenizer
        self.server = server  # http_app.EngineServer: names, auth, hang gate, request ids
        self.max_model_len = engine.plan.max_model_len
        self.max_logprobs = engine.cfg.serve.max_logprobs
        self.interval = engine.cfg.serve.stream_interval
        self.role = engine.cfg.serve.response_role
        # vLLM's --enable-prompt-tokens-details: usage says how many prompt tokens were cached
        self.details = bool(engine.cfg.args.enable_prompt_tokens_details)
        cfg, launch = engine.cfg, engine.plan.launch
        self.fingerprint = R.system_fingerprint(
            cfg.vllm_version, launch.tensor_parallel_size, launch.pipeline_parallel_size,
            launch.data_parallel_size, bool(cfg.args.enable_expert_parallel),
            launch.model_dump_json())

    async def completions(self, request: web.Request) -> web.StreamResponse:
        await self.server.admit(request)
        body = parse_body(await request.read(), CompletionBody)
        model = self.server.check_model(body.model)
        self._common_checks(body)
        top = self._top(body.logprobs, "logprobs")
        prompt_ids = self._prompt_ids(body)
        max_tokens = body.max_tokens if body.max_tokens is not None else 16
        self._check_fits(prompt_ids, max_tokens)
        self._check_max_tokens(max_tokens, body.min_tokens)
        job = self._job(request, body, False, model, prompt_ids, max_tokens, top)
        return await self._serve(request, job)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        await self.server.admit(request)
        body = parse_body(await request.read(), ChatBody)
        model = self.server.check_model(body.model)
        self._common_checks(body)
        top = self._top(body.top_logprobs or 0, "top_logprobs") if body.logprobs else None
        text = render_chat(body.messages, self.tok.special, body.add_generation_prompt,
                           body.continue_final_message, self.role)
        prompt_ids = self.tok.encode(text, add_special_tokens=body.add_special_tokens)
        requested = body.max_completion_tokens if body.max_completion_tokens is not None \
            else body.max_tokens
        self._check_fits(prompt_ids, requested or 0)
        max_tokens = requested if requested is not None else self.max_model_len - len(prompt_ids)
        self._check_max_tokens(max_tokens, body.min_tokens)
        job = self._job(request, body, True, model, prompt_ids, max_tokens, top,
                        text if body.return_prompt_text else None)
        return await self._serve(request, job)

    # -- validation -------------------------------------------------------------------------
    def _common_checks(self, body: CommonBody) -> None:
        if body.n != 1:
            raise bad_request("n must be 1: the engine emulator generates one choice per request",
                              "n", body.n)
        if body.echo:
            raise bad_request("echo is not supported by the engine emulator", "echo", body.echo)
        if body.min_tokens < 0:
            raise bad_request(f"min_tokens must be greater than or equal to 0, got "
                              f"{body.min_tokens}.", "min_tokens", body.min_tokens)

    def _top(self, value: int | None, param: str) -> int | None:
        if value is None:
            return None
        if value == -1:
            return self.max_logprobs
        if value < 0:
            raise bad_request(f"`{param}` must be a positive value or -1.", param, value)
        if value > self.max_logprobs:
            raise bad_request(f"Requested sample logprobs of {value}, which is greater than max "
                              f"allowed: {self.max_logprobs}", param, value)
        return value

    def _prompt_ids(self, body: CompletionBody) -> list[int]:
        prompt: object = body.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise bad_request("batched prompts are not supported by the engine emulator; "
                                  "send one prompt per request", "prompt", len(prompt))
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.tok.encode(prompt, add_special_tokens=body.add_special_tokens)
        ids = [int(t) for t in prompt] if isinstance(prompt, list) else []
        for token in ids:
            if not self.tok.in_vocab(token):
                raise bad_request(f"Token id {token} is out of vocabulary", "prompt", token)
        if not ids:
            raise bad_request("Either prompt or prompt_embeds must be provided and non-empty.",
                              "prompt")
        return ids

    def _check_fits(self, prompt_ids: list[int], max_tokens: int) -> None:
        """vLLM's renderer check: the prompt plus the requested output fit the context."""
        n = len(prompt_ids)
        limit = self.max_model_len
        if n > limit - max(max_tokens, 0):
            raise bad_request(
                f"You passed {n} input tokens and requested {max_tokens} output tokens. However, "
                f"the model's context length is only {limit} tokens, resulting in a maximum "
                f"input length of {limit - max_tokens} tokens. Please reduce the length of the "
                "input prompt.", "input_tokens", n)

    def _check_max_tokens(self, max_tokens: int, min_tokens: int) -> None:
        if max_tokens < 1:
            raise bad_request(f"max_tokens must be at least 1, got {max_tokens}.",
                              "max_tokens", max_tokens)
        if min_tokens > max_tokens:
            raise bad_request(f"min_tokens must be less than or equal to max_tokens={max_tokens}, "
                              f"got {min_tokens}.", "min_tokens", min_tokens)

    def _job(self, request: web.Request, body: CommonBody, chat: bool, model: str,
             prompt_ids: list[int], max_tokens: int, top: int | None,
             prompt_text: str | None = None) -> Job:
        base = request.headers.get("X-Request-Id") or body.request_id or uuid.uuid4().hex
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{base}"
        options = body.stream_options
        stream = bool(body.stream)
        return Job(
            chat=chat, head=R.Head(rid, int(time.time()), model, chat, self.fingerprint),
            prompt_ids=prompt_ids,
            sampling=Sampling(max_tokens, body.min_tokens, body.ignore_eos,
                              body.kv_transfer_params, body.cache_salt),
            stream=stream, include_usage=bool(stream and options and options.include_usage),
            continuous_usage=bool(stream and options and options.include_usage
                                  and options.continuous_usage_stats),
            return_token_ids=bool(body.return_token_ids),
            interval=max(self.interval, body.stream_interval or 1), logprobs=top, role=self.role,
            prompt_text=prompt_text)

    # -- generation ----------------------------------------------------------------------------
    async def _serve(self, request: web.Request, job: Job) -> web.StreamResponse:
        headers = self.server.response_headers(job.head.request_id)
        if job.stream:
            return await self._stream(request, job, headers)
        try:
            run = await self.engine.submit(job.head.request_id, job.prompt_ids, job.sampling)
        except KvLoadFailed:
            raise internal_error() from None
        except EngineDead:
            raise engine_dead_error(ENGINE_DEAD_MESSAGE) from None
        try:
            await run.done()
        except asyncio.CancelledError:
            self.engine.abort(run)
            raise
        if self.engine.dead:
            raise engine_dead_error(ENGINE_DEAD_MESSAGE)
        return web.Response(body=R.body(self._full(job, run)), headers=headers,
                            content_type="application/json")

    def _full(self, job: Job, run: Run) -> dict[str, Any]:
        ids = run.planned.token_ids[:run.seq.produced]
        text = self.tok.decode(ids)
        kv = self.engine.finish_kv(run)
        logprobs = self._logprobs(job, run, ids, 0, 0)[0]
        token_ids = ids if job.return_token_ids else None
        prompt_ids = job.prompt_ids if job.return_token_ids else None
        n_prompt = len(job.prompt_ids)
        if job.chat:
            body = R.chat_body(job.head, job.role, text, logprobs, run.finish_reason, token_ids,
                               prompt_ids, job.prompt_text, n_prompt, len(ids), kv)
        else:
            body = R.completion_body(job.head, text, logprobs, run.finish_reason, token_ids,
                                     prompt_ids, n_prompt, len(ids), kv)
        self._cached(body["usage"], run)
        return body

    def _cached(self, usage: dict[str, Any], run: Run) -> None:
        """With --enable-prompt-tokens-details, vLLM's `cached_tokens`: the prompt tokens not
        computed here, found in the prefix cache or pulled from a producer."""
        if self.details:
            usage["prompt_tokens_details"] = {"cached_tokens": run.seq.local_hit
                                              + run.seq.external}

    def _logprobs(self, job: Job, run: Run, ids: list[int], start: int,
                  offset: int) -> tuple[dict[str, Any] | None, int]:
        if job.logprobs is None:
            return None, offset
        writer = R.LogprobWriter(self.tok, self.engine.generator, run.planned.states)
        if job.chat:
            return writer.chat(ids, start, job.logprobs), offset
        return writer.completion(ids, start, job.logprobs, offset)

    async def _stream(self, request: web.Request, job: Job,
                      headers: dict[str, str]) -> web.StreamResponse:
        response = web.StreamResponse(headers={**SSE_HEADERS, **headers})
        await response.prepare(request)
        try:
            run = await self.engine.submit(job.head.request_id, job.prompt_ids, job.sampling)
        except (KvLoadFailed, EngineDead) as exc:
            message = ENGINE_DEAD_MESSAGE if isinstance(exc, EngineDead) else \
                "Internal server error"
            await response.write(R.sse(R.error_chunk(message, "InternalServerError", 500)))
            await response.write(R.DONE)
            return response
        try:
            await self._stream_run(response, job, run)
        except ConnectionResetError:
            self.engine.abort(run)  # the client left mid-stream: vLLM aborts the request too
        except asyncio.CancelledError:
            self.engine.abort(run)
            raise
        return response

    async def _stream_run(self, response: web.StreamResponse, job: Job, run: Run) -> None:
        head, tok = job.head, self.tok
        n_prompt = len(job.prompt_ids)
        prompt_ids = job.prompt_ids if job.return_token_ids else None
        if job.chat:
            chunk = R.chat_role_chunk(head, job.role, prompt_ids, job.prompt_text)
            if job.continuous_usage:
                chunk["usage"] = R.usage(n_prompt, 0, False)
            await response.write(R.sse(chunk))
        offset = 0
        async for start, end in run.deltas(job.interval):
            ids = run.planned.token_ids[start:end]
            finish = run.finish_reason if run.seq.finished and end == run.seq.produced else None
            logprobs, offset = self._logprobs(job, run, ids, start, offset)
            token_ids = ids if job.return_token_ids else None
            if job.chat:
                chunk = R.chat_chunk(head, tok.decode(ids), logprobs, finish, token_ids)
            else:
                chunk = R.completion_chunk(head, tok.decode(ids), logprobs, finish, token_ids,
                                           prompt_ids if start == 0 else None)
            if job.continuous_usage:
                chunk["usage"] = R.usage(n_prompt, end, False)
            await response.write(R.sse(chunk))
        if self.engine.dead:
            await response.write(R.sse(R.error_chunk(ENGINE_DEAD_MESSAGE, "InternalServerError",
                                                     500)))
        elif job.include_usage:
            chunk = R.usage_chunk(head, n_prompt, run.seq.produced)
            self._cached(chunk["usage"], run)
            await response.write(R.sse(chunk))
        await response.write(R.DONE)


def api_error_response(error: ApiError) -> web.Response:
    return web.Response(status=error.status, body=R.body(error.body()),
                        content_type="application/json")
