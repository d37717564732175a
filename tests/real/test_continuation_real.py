"""A stream continued on another real vLLM CPU engine after its engine stalled mid-answer.

Through narwhal-serve in front of the session pair (both engines may serve a whole request),
a greedy stream's engine is stopped (SIGSTOP) after the client got part of the answer; the
router finds the stall after its deadline and continues the answer on the other engine from
the prompt plus the text already sent. The client must get exactly the text the same request
gets on the unfaulted pair, with the usage of the whole answer. The sampler is held to word
tokens (vLLM's `allowed_token_ids`), whose text encodes back to the ids that made it: the
condition under which docs/router.md says a greedy continuation is exact (a random-weight
model otherwise emits byte tokens whose text does not).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fidelity import client
from tests.fidelity.requests import SERVED_NAME
from tests.real.engines import Engine, EngineSpec, free_port, running
from tests.real.live import Counters, serving
from tests.real.session import Pair

PROMPT = "the world of people and the state of things"
WORDS = (" the of and to in a is that for it as was with be by on not he this are or his"
         " from at which but have an they you were her she there been one all we their")


def _fleet(engines: dict[str, Engine], **extra: Any) -> dict[str, Any]:
    """A fleet of `both` engines by name that ejects a failed engine at once."""
    return {"schema": "narwhal.fleet", "schema_version": 1, "model": SERVED_NAME,
            "engines": [{"id": name, "url": e.url, "role": "both"} for name, e in engines.items()],
            "slo": {"ttft_s": 20.0, "tpot_s": 0.5}, "journal": {"path": "journal.jsonl"},
            "health": {"eject_after_failures": 1, "probe_interval_s": 0.5,
                       "probe_timeout_s": 1.0}, **extra}


def _greedy_body(engine: Engine, tokens: int) -> dict[str, Any]:
    """A greedy stream of `tokens` held to word tokens, whose text encodes back to its ids."""
    words = client.post(f"{engine.url}/tokenize", {
        "model": SERVED_NAME, "prompt": WORDS, "add_special_tokens": False}).json()["tokens"]
    return {"model": SERVED_NAME, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True, "allowed_token_ids": sorted(set(words)), "stream": True,
            "stream_options": {"include_usage": True}}


@pytest.fixture
def router(pair: Pair, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    fleet = _fleet({"p": pair.prefill, "d": pair.decode},
                   serving={"stall_steps": 2, "stall_floor_s": 1.0})
    try:
        with serving(tmp_path, fleet) as port:
            yield port, tmp_path / "journal.jsonl"
    finally:
        for engine in pair.engines:  # a test that stopped an engine leaves it running
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine.process.pid, signal.SIGCONT)


def _stream(port: int, body: dict[str, Any], request_id: str, on_event: Any = None
            ) -> list[Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"content-type": "application/json", "x-request-id": request_id})
    response = conn.getresponse()
    assert response.status == 200, response.read()[:500]
    events: list[Any] = []
    while True:
        line = response.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            data = line[6:].strip()
            events.append("[DONE]" if data == b"[DONE]" else json.loads(data))
            if on_event is not None:
                on_event(len(events))
            if data == b"[DONE]":
                break
    conn.close()
    return events


def _text(events: list[Any]) -> str:
    return "".join(e["choices"][0]["text"] for e in events
                   if isinstance(e, dict) and e.get("choices"))


def _journal_row(journal: Path, request_id: str) -> dict[str, Any]:
    """The request's journal row (its writer is waited for, bounded)."""
    deadline = time.monotonic() + 10
    while True:
        rows = [json.loads(line) for line in journal.read_text().splitlines()] \
            if journal.exists() else []
        found = [r for r in rows if r["request_id"] == request_id]
        if found or time.monotonic() > deadline:
            assert found, f"no journal row for {request_id}"
            return dict(found[-1])
        time.sleep(0.1)


def _running(pair: Pair) -> Any:
    return _running_of(list(pair.engines))


def _running_of(engines: list[Engine]) -> Engine | None:
    """The engine whose own counters say it runs a request now."""
    for engine in engines:
        counters = Counters.read(engine.url)
        running = sum(v for (name, _), v in counters.values.items()
                      if name == "vllm:num_requests_running")
        if running > 0:
            return engine
    return None


def test_a_greedy_stream_whose_engine_stalls_continues_on_the_other_with_the_same_text(
        pair: Pair, router: tuple[int, Path]) -> None:
    port, journal = router
    body = _greedy_body(pair.prefill, 160)
    reference = _stream(port, body, "reference")
    assert reference[-1] == "[DONE]" and reference[-2]["usage"]["completion_tokens"] == 160
    stopped: list[Any] = []

    def stop_its_engine(seen: int) -> None:
        if seen == 8 and not stopped:
            engine = _running(pair)
            assert engine is not None, "neither engine reports the request running"
            os.kill(engine.process.pid, signal.SIGSTOP)
            stopped.append(engine)

    try:
        events = _stream(port, body, "stalled", stop_its_engine)
    finally:
        for engine in stopped:
            os.kill(engine.process.pid, signal.SIGCONT)
    assert stopped
    assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1])
    assert _text(events) == _text(reference)
    assert events[-2]["usage"] == reference[-2]["usage"]
    row = _journal_row(journal, "stalled")
    assert row["outcome"] == "ok"
    (step,) = row["continued"]
    assert step["exact"] is True and step["after_tokens"] >= 7
    names = {pair.prefill.url: "p", pair.decode.url: "d"}
    assert step["from"] == names[stopped[0].url] and step["to"] != step["from"]


@pytest.fixture
def victim(pair: Pair, tmp_path: Path) -> Iterator[Engine]:
    """A third real engine, on the prefill engine's core, for a test to kill: the session
    pair serves every test after."""
    spec = EngineSpec("victim", core=0, http_port=free_port(), side_channel_port=free_port(),
                      model=pair.model, log=tmp_path / "victim.log")
    with running(spec, pair.python) as engine:
        yield engine


def test_a_greedy_stream_whose_engine_is_killed_continues_on_the_other_with_the_same_text(
        pair: Pair, victim: Engine, tmp_path: Path) -> None:
    """The acceptance's SIGKILL on real vLLM: the engine decoding the stream is killed (its
    whole process group) after the client got 8 events; the router finds the reset connection
    and continues on the survivor, and the client gets the unfaulted text and usage."""
    survivor = pair.decode
    fleet = _fleet({"v": victim, "d": survivor})
    body = _greedy_body(survivor, 96)
    killed: list[str] = []

    def kill_if_victim_runs_it(seen: int) -> None:
        if seen == 8 and not killed and _running_of([victim, survivor]) is victim:
            os.killpg(victim.process.pid, signal.SIGKILL)
            killed.append("v")

    with serving(tmp_path, fleet) as port:
        reference = _stream(port, body, "reference")
        # least-outstanding placement takes turns between the two: within a few tries one
        # stream runs on the victim
        for attempt in range(4):
            events = _stream(port, body, f"killed-{attempt}", kill_if_victim_runs_it)
            if killed:
                break
        assert killed, "no stream ran on the victim engine"
        journal = tmp_path / "journal.jsonl"
        assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1])
        assert _text(events) == _text(reference)
        assert events[-2]["usage"] == reference[-2]["usage"]
        row = _journal_row(journal, f"killed-{attempt}")
    assert victim.process.wait(timeout=10) is not None
    assert row["outcome"] == "ok"
    (step,) = row["continued"]
    assert (step["from"], step["to"], step["exact"]) == ("v", "d", True)
    assert step["after_tokens"] >= 7
