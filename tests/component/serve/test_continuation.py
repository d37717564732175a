"""Streams that survive a dying decode engine, through the router to emulator processes.

A greedy request's answer is a function of its tokens on every emulator (generator.py), so
the answer a request gets on an unfaulted fleet is the reference: the same request, whose
decode engine is killed (SIGKILL) or stopped (SIGSTOP) while it streams, must give the client
that exact text, in one gap-free stream with one id and the usage of the whole answer, and its
journal row must name the continuation.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from narwhal.lab.engine.testing import RunningEngine, free_port, start_engine, write_tiny_llama
from tests.component.serve.harness import Router, call, journal_rows

pytestmark = pytest.mark.timeout(240)
KV_BOTH = '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"cpu"}'
STEP_S = 0.03  # a decode step: 40 tokens stream for about 1.2 s
ENGINE_ARGS = ["--served-model-name", "tiny", "--kv-transfer-config", KV_BOTH,
               "--emu-platform", "cpu", "--dtype", "float32", "--enforce-eager",
               "--block-size", "32", "--kv-cache-memory-bytes", "64M",
               "--emu-eos-probability", "0", "--emu-decode-base", str(STEP_S),
               "--emu-decode-per-token", "0", "--emu-decode-per-request", "0"]
ROLES = {"p0": "prefill", "d0": "decode", "d1": "decode", "d2": "decode"}
STALL_FLOOR_S = 0.6
PROMPT = "the world of people and the state of things"


class Fleet:
    """Emulators and a router in front; engines are restarted on their ports after a test
    killed or stopped one, so each test starts from a whole fleet."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.model = write_tiny_llama(root / "tiny")
        self.engines: dict[str, RunningEngine] = {}
        self.router: Router | None = None
        self.journal = root / "j.jsonl"

    def start(self) -> Fleet:
        for name in ROLES:
            self.engines[name] = self._engine(name)
        doc = {"schema": "narwhal.fleet", "schema_version": 1, "model": "tiny",
               "engines": [{"id": n, "url": e.url, "role": ROLES[n]}
                           for n, e in self.engines.items()],
               "slo": {"ttft_s": 2.0, "tpot_s": 0.1}, "journal": {"path": str(self.journal)},
               "health": {"eject_after_failures": 1, "probe_interval_s": 0.2,
                          "probe_timeout_s": 0.5},
               "serving": {"stall_steps": 5, "stall_floor_s": STALL_FLOOR_S}}
        (self.root / "fleet.json").write_text(json.dumps(doc))
        self.router = Router(self.root / "fleet.json", free_port()).start()
        return self

    def _engine(self, name: str, port: int | None = None) -> RunningEngine:
        return start_engine(self.model, log_path=self.root / f"{name}.log", port=port,
                            extra_args=ENGINE_ARGS,
                            env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"})

    def heal(self) -> None:
        """Every engine running and admitted again (a stopped one continued, a dead one
        restarted on its port)."""
        for name, engine in self.engines.items():
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine.pid, signal.SIGCONT)
            if not engine.alive():
                engine.process.wait()
                self.engines[name] = self._engine(name, engine.port)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            state = call(self.port, "GET", "/narwhal/state").json()
            if all(e["admitted"] for e in state["engines"]):
                return
            time.sleep(0.1)
        raise AssertionError(f"engines not readmitted: {state['engines']}")

    @property
    def port(self) -> int:
        assert self.router is not None
        return self.router.port

    def stop(self) -> None:
        if self.router is not None and self.router.proc is not None \
                and self.router.proc.poll() is None:
            self.router.stop()
        for engine in self.engines.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine.pid, signal.SIGCONT)
            engine.stop()

    def running(self) -> str | None:
        """The decode engine with a request running now (from its own metrics)."""
        for name in ("d0", "d1", "d2"):
            engine = self.engines[name]
            if not engine.alive():
                continue
            with contextlib.suppress(OSError):
                text = call(engine.port, "GET", "/metrics", timeout=0.5).body.decode()
                for line in text.splitlines():
                    if line.startswith("vllm:num_requests_running{") \
                            and float(line.rsplit(" ", 1)[1]) > 0:
                        return name
        return None


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path_factory.mktemp("continuation"))
    try:
        yield fleet.start()
    finally:
        fleet.stop()


@pytest.fixture
def whole(fleet: Fleet) -> Iterator[Fleet]:
    fleet.heal()
    yield fleet
    fleet.heal()


class Stream:
    """A streamed request read event by event, with the time each event arrived."""

    def __init__(self, port: int, path: str, body: dict[str, Any], request_id: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.conn.request("POST", path, json.dumps(body),
                          {"content-type": "application/json", "x-request-id": request_id})
        self.response = self.conn.getresponse()
        assert self.response.status == 200
        self.events: list[Any] = []
        self.times: list[float] = []

    def read(self, n: int | None = None) -> None:
        """Read `n` more events (all of them when None)."""
        want = None if n is None else len(self.events) + n
        while want is None or len(self.events) < want:
            line = self.response.readline()
            if not line:
                return
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            self.events.append("[DONE]" if data == b"[DONE]" else json.loads(data))
            self.times.append(time.monotonic())
            if data == b"[DONE]":
                return

    def close(self) -> None:
        self.conn.close()


def _row(fleet: Fleet, request_id: str) -> dict[str, Any]:
    """The journal row of `request_id` (the writer is waited for, bounded)."""
    deadline = time.monotonic() + 5
    while True:
        rows = [r for r in journal_rows(fleet.journal) if r["request_id"] == request_id]
        if rows or time.monotonic() > deadline:
            assert rows, f"no journal row for {request_id}"
            return rows[-1]
        time.sleep(0.05)


def _text(events: list[Any], chat: bool) -> str:
    out = ""
    for e in events:
        if isinstance(e, dict) and e.get("choices"):
            choice = e["choices"][0]
            part = choice.get("delta", {}).get("content") if chat else choice.get("text")
            out += part or ""
    return out


def _body(chat: bool, **extra: Any) -> dict[str, Any]:
    common = {"model": "tiny", "temperature": 0, "stream": True,
              "stream_options": {"include_usage": True}, **extra}
    if chat:
        return {"messages": [{"role": "user", "content": PROMPT}], "max_completion_tokens": 40,
                **common}
    return {"prompt": PROMPT, "max_tokens": 40, **common}


def _reference(fleet: Fleet, path: str, body: dict[str, Any], chat: bool) -> list[Any]:
    stream = Stream(fleet.port, path, body, "reference")
    stream.read()
    stream.close()
    assert stream.events[-1] == "[DONE]" and not any("error" in e for e in stream.events[:-1])
    return stream.events


def _broken(fleet: Fleet, path: str, body: dict[str, Any], request_id: str, sig: int,
            after: int = 6) -> tuple[Stream, str]:
    """A stream whose decode engine got `sig` after `after` events reached the client."""
    stream = Stream(fleet.port, path, body, request_id)
    stream.read(after)
    victim = fleet.running()
    assert victim is not None, "no decode engine reports the request running"
    os.kill(fleet.engines[victim].pid, sig)
    stream.read()
    stream.close()
    return stream, victim


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_a_stream_whose_decode_engine_is_killed_continues_with_the_unfaulted_answer(
        whole: Fleet, chat: bool) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = _body(chat)
    reference = _reference(whole, path, body, chat)
    stream, victim = _broken(whole, path, body, f"killed-{chat}", signal.SIGKILL)
    events = stream.events
    assert events[-1] == "[DONE]"
    assert not any("error" in e for e in events[:-1]), events
    assert _text(events, chat) == _text(reference, chat)
    # one stream: one id, one role delta, one finish, the usage of the whole answer
    docs = [e for e in events if isinstance(e, dict)]
    assert len({e["id"] for e in docs}) == 1
    if chat:
        assert sum("role" in (e["choices"] or [{}])[0].get("delta", {}) for e in docs) == 1
    assert sum(bool(e["choices"] and e["choices"][0].get("finish_reason")) for e in docs) == 1
    assert docs[-1]["usage"] == reference[-2]["usage"]
    row = _row(whole, f"killed-{chat}")
    assert row["outcome"] == "ok" and row["status"] == 200
    (step,) = row["continued"]
    assert step["from"] == victim and step["to"] != victim and step["exact"] is True
    assert step["after_tokens"] >= 5
    assert row["decode_engine"] == step["to"] and row["decode_attempts"] == 2


def test_a_non_streaming_request_whose_decode_engine_dies_gets_the_whole_answer(
        whole: Fleet) -> None:
    body = {**_body(False), "stream": False, "max_tokens": 60}
    del body["stream_options"]
    reference = call(whole.port, "POST", "/v1/completions", body).json()

    def kill_when_running() -> str:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            victim = whole.running()
            if victim is not None:
                time.sleep(10 * STEP_S)
                os.kill(whole.engines[victim].pid, signal.SIGKILL)
                return victim
            time.sleep(0.02)
        raise AssertionError("the request never ran")

    killed: list[str] = []
    killer = threading.Thread(target=lambda: killed.append(kill_when_running()))
    killer.start()
    reply = call(whole.port, "POST", "/v1/completions", body, {"x-request-id": "buffered"})
    killer.join()
    assert reply.status == 200, reply.body
    doc = reply.json()
    assert doc["choices"][0]["text"] == reference["choices"][0]["text"]
    assert doc["usage"] == reference["usage"]
    row = _row(whole, "buffered")
    assert row["continued"][0]["from"] == killed[0]


def test_a_stopped_decode_engine_s_stream_continues_after_its_stall_deadline(
        whole: Fleet) -> None:
    body = _body(False)
    reference = _reference(whole, "/v1/completions", body, False)
    stream, victim = _broken(whole, "/v1/completions", body, "stopped", signal.SIGSTOP)
    assert _text(stream.events, False) == _text(reference, False)
    gaps = [b - a for a, b in zip(stream.times, stream.times[1:], strict=False)]
    # the stall deadline (5 steps of the 0.1 s objective, floored at 0.6 s) plus the new
    # engine's prefill of the prompt and the answer so far
    assert max(gaps) < STALL_FLOOR_S + 1.5, max(gaps)
    assert max(gaps) > STALL_FLOOR_S * 0.8
    os.kill(whole.engines[victim].pid, signal.SIGCONT)
    time.sleep(5 * STEP_S)  # the stopped engine runs on: nothing of it reaches the client
    row = _row(whole, "stopped")
    assert row["continued"][0]["from"] == victim
    assert "sent nothing" in row["continued"][0]["reason"] or \
        "stopped sending" in row["continued"][0]["reason"]


def test_an_option_whose_state_cannot_resume_ends_the_stream_with_an_error_event(
        whole: Fleet) -> None:
    body = _body(False, response_format={"type": "json_object"})
    stream, _ = _broken(whole, "/v1/completions", body, "structured", signal.SIGKILL)
    assert stream.events[-1] == "[DONE]"
    assert stream.events[-2]["error"]["code"] == "engine_failed"
    row = _row(whole, "structured")
    assert row["outcome"] == "decode_failed_midstream"
    assert "not continued: structured output" in row["reason"]
    assert "continued" not in row


def test_a_token_id_prompt_continues_with_the_unfaulted_answer(whole: Fleet) -> None:
    ids = json.loads(call(whole.engines["p0"].port, "POST", "/tokenize",
                          {"model": "tiny", "prompt": PROMPT}).body)["tokens"]
    body = {**_body(False), "prompt": ids}
    reference = _reference(whole, "/v1/completions", body, False)
    stream, _ = _broken(whole, "/v1/completions", body, "ids", signal.SIGKILL)
    assert _text(stream.events, False) == _text(reference, False)
    assert stream.events[-2]["usage"] == reference[-2]["usage"]
