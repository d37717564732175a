#!/usr/bin/env python3
"""The router's own CPU per request with the network taken out: a deterministic hot-path bench.

    .venv/bin/python bench/hot_path.py [--requests 20000] [--tokens 16] [--chunks-per-read 1]
                                       [--priced]

Real Router objects (front, routes, proxy, relay, journal, metrics) serve requests from an
in-memory client; engines are in-memory transports behind the router's `Connector` seam that
answer a prefill leg with a vLLM-shaped body and a decode leg with `--tokens` SSE events,
delivered `--chunks-per-read` at a time as separate reads. No syscalls and no other process,
so the figure is the Python (and C-extension) work per request, stable to a few percent
between runs: use it to compare changes to the hot path. `--priced` places with the
curve-priced scheduler (as a fleet with a profile store does) instead of least-outstanding;
the bench binds made-up profile rows directly, since its engines answer no /version. bench/router_overhead.py measures the
whole cost (kernel, wakeups, real engines) against other routers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop

from narwhal.core.fleet import parse_fleet
from narwhal.core.profiles import DecodeCurve, Generation, PrefillCurve, ProfileRow, now_utc
from narwhal.serve.router.app import Router
from narwhal.serve.router.front.front import ClientConnection
from narwhal.serve.router.scheduling.scheduler import CurvePriced
from narwhal.serve.router.settings import settle

PROMPT = " ".join(f"word{i}" for i in range(64))
KV = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[1, 2, 3, 4, 5]],
      "remote_engine_id": "0ae84987-24a3-4f4f-a9fd-da5f0d7965e2",
      "remote_request_id": "cmpl-329fcdd01bb44fcb80d824a4390cae6a-0-74e3e7fe",
      "remote_host": "localhost", "remote_port": 5600, "tp_size": 1, "dcp_size": 1, "pp_size": 1,
      "remote_num_tokens": 65, "remote_blocks_expiry_time": None, "transfer_mode": "pull",
      "remote_prefill_cached_tokens": 0}


def _prefill_response() -> bytes:
    body = json.dumps({
        "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "tiny",
        "choices": [{"index": 0, "text": " any", "logprobs": None, "finish_reason": "length",
                     "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
                     "prompt_token_ids": None}],
        "service_tier": None, "system_fingerprint": None,
        "usage": {"prompt_tokens": 65, "total_tokens": 66, "completion_tokens": 1,
                  "prompt_tokens_details": None},
        "kv_transfer_params": KV}).encode()
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
            % (len(body), body))


def _decode_reads(tokens: int, per_read: int) -> list[bytes]:
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"transfer-encoding: chunked\r\n\r\n")
    chunks = []
    for k in range(tokens):
        event = {"id": "cmpl-2", "object": "text_completion", "created": 1, "model": "tiny",
                 "choices": [{"index": 0, "text": f" tok{k}", "logprobs": None,
                              "finish_reason": "length" if k == tokens - 1 else None,
                              "stop_reason": None, "prompt_token_ids": None, "token_ids": None}]}
        data = b"data: " + json.dumps(event).encode() + b"\n\n"
        chunks.append(b"%x\r\n%b\r\n" % (len(data), data))
    chunks.append(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
    reads = [head]
    for i in range(0, len(chunks), per_read):
        reads.append(b"".join(chunks[i:i + per_read]))
    return reads


class EngineTransport(asyncio.Transport):
    """An engine on the other end of an upstream connection, answering from memory."""

    def __init__(self, proto: asyncio.Protocol, prefill: bytes, decode: list[bytes]) -> None:
        super().__init__()
        self.proto = proto
        self.prefill = prefill
        self.decode = decode
        self.loop = asyncio.get_running_loop()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        raw = bytes(data)
        if raw.startswith(b"GET /health"):
            self.loop.call_soon(self.proto.data_received, b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        elif b'"do_remote_decode":true' in raw:
            self.loop.call_soon(self.proto.data_received, self.prefill)
        else:
            for piece in self.decode:  # one read each, as separate loop callbacks
                self.loop.call_soon(self.proto.data_received, piece)

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class ClientTransport(asyncio.Transport):
    """The client: sends the next request when the previous response has ended."""

    def __init__(self, request: bytes, total: int, done: asyncio.Future[None]) -> None:
        super().__init__()
        self.request = request
        self.left = total
        self.done = done
        self.proto: ClientConnection | None = None
        self.loop = asyncio.get_running_loop()
        self.bytes = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.bytes += len(data)
        if bytes(data).endswith(b"0\r\n\r\n"):
            self.left -= 1
            if self.left == 0:
                self.done.set_result(None)
            else:
                assert self.proto is not None
                self.loop.call_soon(self.proto.data_received, self.request)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def _connector(prefill: bytes, decode: list[bytes]) -> Callable[..., Any]:
    async def connect(factory: Callable[[], asyncio.Protocol], host: str,
                      port: int) -> tuple[asyncio.BaseTransport, asyncio.Protocol]:
        proto = factory()
        transport = EngineTransport(proto, prefill, decode)
        proto.connection_made(transport)
        return transport, proto
    return connect


def _bind_curves(router: Router) -> None:
    """Give every engine a profile row and place by curves, as with a profile store."""
    fit: dict[str, Any] = {"fit_error": 0.02, "loo_error": 0.03, "samples": 12}
    for engine in router.engines:
        engine.profile = ProfileRow(
            engine_id=engine.id, measured_at=now_utc(),
            generation=Generation(engine_version="bench", process_start_time_seconds=1.0),
            prefill=PrefillCurve(a_s=0.002, b_s_per_token=1e-5, c_s_per_token2=1e-9,
                                 max_prompt_tokens=4096, **fit),
            decode=DecodeCurve(base_s=0.004, per_token_s=2e-8, per_request_s=1e-4,
                               max_requests=64, max_resident_tokens=65536, **fit))
    router.proxy.chooser = CurvePriced(router.engines, router.settings.ttft_s,
                                       router.settings.tpot_s)


def fleet_engines(count: int) -> list[dict[str, str]]:
    """`count` engines (even, at least 2): half prefill (p0, p1, ...), half decode."""
    half = max(1, count // 2)
    return ([{"id": f"p{i}", "url": f"http://127.0.0.1:{1 + i}", "role": "prefill"}
             for i in range(half)]
            + [{"id": f"d{i}", "url": f"http://127.0.0.1:{1 + half + i}", "role": "decode"}
               for i in range(half)])


async def run(requests: int, tokens: int, per_read: int, work: Path,
              priced: bool = False, engines: int = 2) -> dict[str, float]:
    doc = parse_fleet({
        "schema": "narwhal.fleet", "schema_version": 1, "model": "tiny",
        "engines": fleet_engines(engines),
        "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
        "journal": {"path": str(work / "journal.jsonl")},
        "controller": {"lease_ttl_s": 60}}, "bench")
    settings = settle(doc, {}, work / "fleet.json")
    router = Router(settings, connector=_connector(_prefill_response(),
                                                  _decode_reads(tokens, per_read)))
    if priced:
        _bind_curves(router)
    router.leadership.claim()  # a lease file in the temporary folder: this bench is the primary
    router.journal.open()
    await router.health.probe_all()
    body = json.dumps({"model": "tiny", "prompt": PROMPT, "max_tokens": tokens,
                       "stream": True}).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json"
               b"\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
    loop = asyncio.get_running_loop()

    async def serve(n: int) -> float:
        done: asyncio.Future[None] = loop.create_future()
        client = ClientTransport(request, n, done)
        conn = ClientConnection(router.routes, router.settings.clients, router.connections)
        client.proto = conn
        conn.connection_made(client)
        t0 = time.process_time()
        conn.data_received(request)
        await done
        return time.process_time() - t0

    await serve(min(2000, requests))  # warm up
    spent = await serve(requests)
    router.journal.close()
    return {"us_per_request": spent / requests * 1e6, "journal_rows": router.journal.written,
            "journal_dropped": router.journal.dropped}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--chunks-per-read", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--priced", action="store_true",
                    help="place with the curve-priced scheduler (a fleet with profiles)")
    args = ap.parse_args()
    results = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            results.append(uvloop.run(run(args.requests, args.tokens, args.chunks_per_read,
                                          Path(tmp), args.priced)))
    per = sorted(r["us_per_request"] for r in results)
    print(json.dumps({"policy": "curve_priced" if args.priced else "least_outstanding",
                      "tokens": args.tokens, "chunks_per_read": args.chunks_per_read,
                      "requests": args.requests, "us_per_request_runs": [round(p, 1) for p in per],
                      "us_per_request_median": round(per[len(per) // 2], 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
