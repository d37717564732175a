"""Streams that survive a dying decode engine, through the router to emulator processes.

A greedy request's answer is a function of its tokens on every emulator (generator.py), so
the answer a request gets on an unfaulted fleet is the reference: the same request, whose
decode engine is killed (SIGKILL) or stopped (SIGSTOP) while it streams, must give the client
that exact text, in one gap-free stream with one id and the usage of the whole answer, and its
journal row must name the continuation.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.component.serve.faulted_fleet import (
    PROMPT,
    STALL_FLOOR_S,
    STEP_S,
    Fleet,
    Stream,
    answer_text,
    journal_row,
    running,
)
from tests.component.serve.harness import call

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running(tmp_path_factory.mktemp("continuation")) as fleet:
        yield fleet


@pytest.fixture
def whole(fleet: Fleet) -> Iterator[Fleet]:
    fleet.heal()
    yield fleet
    fleet.heal()


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
    assert answer_text(events, chat) == answer_text(reference, chat)
    # one stream: one id, one role delta, one finish, the usage of the whole answer
    docs = [e for e in events if isinstance(e, dict)]
    assert len({e["id"] for e in docs}) == 1
    if chat:
        assert sum("role" in (e["choices"] or [{}])[0].get("delta", {}) for e in docs) == 1
    assert sum(bool(e["choices"] and e["choices"][0].get("finish_reason")) for e in docs) == 1
    assert docs[-1]["usage"] == reference[-2]["usage"]
    row = journal_row(whole, f"killed-{chat}")
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
    row = journal_row(whole, "buffered")
    assert row["continued"][0]["from"] == killed[0]


def test_a_stopped_decode_engine_s_stream_continues_after_its_stall_deadline(
        whole: Fleet) -> None:
    body = _body(False)
    reference = _reference(whole, "/v1/completions", body, False)
    stream, victim = _broken(whole, "/v1/completions", body, "stopped", signal.SIGSTOP)
    assert answer_text(stream.events, False) == answer_text(reference, False)
    gaps = [b - a for a, b in zip(stream.times, stream.times[1:], strict=False)]
    # the stall deadline (5 steps of the 0.1 s objective, floored at 0.6 s) plus the new
    # engine's prefill of the prompt and the answer so far
    assert max(gaps) < STALL_FLOOR_S + 1.5, max(gaps)
    assert max(gaps) > STALL_FLOOR_S * 0.8
    os.kill(whole.engines[victim].pid, signal.SIGCONT)
    time.sleep(5 * STEP_S)  # the stopped engine runs on: nothing of it reaches the client
    row = journal_row(whole, "stopped")
    assert row["continued"][0]["from"] == victim
    assert "sent nothing" in row["continued"][0]["reason"] or \
        "stopped sending" in row["continued"][0]["reason"]


def test_an_option_whose_state_cannot_resume_ends_the_stream_with_an_error_event(
        whole: Fleet) -> None:
    body = _body(False, response_format={"type": "json_object"})
    stream, _ = _broken(whole, "/v1/completions", body, "structured", signal.SIGKILL)
    assert stream.events[-1] == "[DONE]"
    assert stream.events[-2]["error"]["code"] == "engine_failed"
    row = journal_row(whole, "structured")
    assert row["outcome"] == "decode_failed_midstream"
    assert "not continued: structured output" in row["reason"]
    assert "continued" not in row


def test_a_token_id_prompt_continues_with_the_unfaulted_answer(whole: Fleet) -> None:
    ids = json.loads(call(whole.engines["p0"].port, "POST", "/tokenize",
                          {"model": "tiny", "prompt": PROMPT}).body)["tokens"]
    body = {**_body(False), "prompt": ids}
    reference = _reference(whole, "/v1/completions", body, False)
    stream, _ = _broken(whole, "/v1/completions", body, "ids", signal.SIGKILL)
    assert answer_text(stream.events, False) == answer_text(reference, False)
    assert stream.events[-2]["usage"] == reference[-2]["usage"]
