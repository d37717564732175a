"""Continuing a broken stream: what the client holds, read back; the continued request; the
continuing engine's events rewritten to read as the first engine's."""

from __future__ import annotations

import json
from typing import Any

import pytest

from narwhal.serve.router.request import continuation as C
from narwhal.serve.router.request.relay import FOLD_BYTES


def _event(doc: Any) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(payload), payload)


def _completion(text: str, finish: str | None = None, rid: str = "cmpl-1",
                created: int = 100) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": created, "model": "m",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}


def _chat(delta: dict[str, Any], finish: str | None = None, rid: str = "chat-1",
          created: int = 100) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": None,
                         "finish_reason": finish}]}


def _events(raw: bytes) -> list[Any]:
    out: list[Any] = []
    for block in raw.split(b"\n\n"):
        if block.startswith(b"data: "):
            data = block[6:]
            out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return out


def test_the_sent_log_reads_back_the_text_the_client_holds_from_chunked_bytes() -> None:
    log = C.sent_log(chat=False, chunked=True)
    for word in (" one", " two", " three"):
        log.add(_chunk(_event(_completion(word))))
    sent = C.read_back(log)
    assert sent is not None
    assert sent.text == " one two three" and sent.events == 3
    assert sent.head == {"id": "cmpl-1", "created": 100, "model": "m"}
    assert sent.finish is None and not sent.done and not sent.usage_sent


def test_a_long_stream_is_folded_into_text_as_it_goes_and_read_back_whole() -> None:
    log = C.sent_log(chat=True, chunked=True)
    log.add(_chunk(_event(_chat({"role": "assistant", "content": ""}))))
    words = [f" w{i}" for i in range(4000)]
    for word in words:
        log.add(_chunk(_event(_chat({"content": word}))))
    assert log.size < FOLD_BYTES + 1024  # folded on the way: not the whole framing kept
    sent = C.read_back(log)
    assert sent is not None and sent.text == "".join(words)


def test_a_stream_past_the_bound_cannot_be_continued() -> None:
    log = C.sent_log(chat=False, chunked=False)
    big = _event(_completion("x" * 65536))
    for _ in range(C.MAX_SENT_BYTES // len(big) + 2):
        log.add(big)
    assert C.read_back(log) is None


def test_the_finish_usage_and_done_the_client_already_has_are_seen() -> None:
    sent = C.Sent()
    sent.read(_event(_completion(" a")) + _event(_completion("", "length"))
              + _event({"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": 3}})
              + b"data: [DONE]\n\n", chat=False)
    assert (sent.text, sent.finish, sent.usage_sent, sent.done) == (" a", "length", True, True)


@pytest.mark.parametrize(("body", "chat", "why"), [
    ({"prompt": "x", "echo": True}, False, "echo"),
    ({"prompt": "x", "prompt_logprobs": 2}, False, "prompt_logprobs"),
    ({"messages": [], "response_format": {"type": "json_object"}}, True, "structured"),
    ({"prompt": "x", "guided_regex": "a+"}, False, "structured"),
    ({"messages": [], "tools": [{"type": "function"}]}, True, "tool calls"),
    ({"messages": [{"role": "assistant", "content": [{"type": "text", "text": "a"}]}],
      "continue_final_message": True}, True, "no plain text"),
])
def test_options_whose_state_a_new_request_cannot_resume_are_named(
        body: dict[str, Any], chat: bool, why: str) -> None:
    assert why in C.not_continuable(body, chat)


def test_plain_sampled_and_greedy_requests_continue_and_only_greedy_ones_exactly() -> None:
    assert C.not_continuable({"messages": [], "tools": [{}], "tool_choice": "none"}, True) == ""
    assert C.not_continuable({"prompt": "x", "temperature": 0.7, "seed": 3}, False) == ""
    assert C.exact({"temperature": 0})
    assert C.exact({"top_k": 1, "temperature": 0.9})
    assert not C.exact({"temperature": 0.7, "seed": 3})
    assert not C.exact({})  # vLLM samples at temperature 1 unless told
    assert not C.exact({"temperature": 0, "presence_penalty": 0.5})


def test_the_continued_completion_extends_the_prompt_and_reduces_the_limits() -> None:
    body = {"model": "m", "prompt": "Hello", "max_tokens": 10, "min_tokens": 4,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    out = json.loads(C.request_body(body, False, " one two", None, C.Counts(2, 2),
                                    body["stream_options"]))
    assert out["prompt"] == "Hello one two"
    assert (out["max_tokens"], out["min_tokens"], out["temperature"]) == (8, 2, 0)
    assert out["stream"] is True and out["stream_options"] == {"include_usage": True}
    assert body["prompt"] == "Hello"  # the client's body is left as it was


def test_a_token_id_prompt_is_continued_with_the_answer_s_own_ids() -> None:
    body = {"prompt": [5, 6, 7], "max_tokens": 5}
    assert C.tokenize_body(body, False, " a b") == {"prompt": " a b", "add_special_tokens": False}
    counts = C.counts_from(body, 3, {"count": 2, "tokens": [300, 301]})
    assert counts == (C.Counts(3, 2), [300, 301])
    out = json.loads(C.request_body(body, False, " a b", [300, 301], C.Counts(3, 2), None))
    assert out["prompt"] == [5, 6, 7, 300, 301] and out["max_tokens"] == 3
    assert "stream_options" not in out


def test_a_chat_is_continued_as_the_assistant_s_unfinished_message() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 6}
    assert C.tokenize_body(body, True, " well") == {
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": " well"}],
        "add_generation_prompt": False, "continue_final_message": True}
    out = json.loads(C.request_body(body, True, " well", None, C.Counts(9, 1), None))
    assert out["messages"][-1] == {"role": "assistant", "content": " well"}
    assert out["continue_final_message"] is True and out["add_generation_prompt"] is False
    assert out["max_completion_tokens"] == 5
    # a client already continuing its own assistant message: the answer extends that message
    own = {"messages": [{"role": "assistant", "content": "Dear"}], "continue_final_message": True}
    assert C.continued_messages(own, " Sir") == [{"role": "assistant", "content": "Dear Sir"}]


@pytest.mark.parametrize("answer", [{"count": "9"}, {"count": 2}, {}, {"count": True}])
def test_a_count_that_is_not_one_or_smaller_than_the_prompt_continues_nothing(
        answer: dict[str, Any]) -> None:
    assert C.counts_from({"prompt": "x"}, 3, answer) is None


def test_a_token_id_count_without_matching_ids_continues_nothing() -> None:
    assert C.counts_from({"prompt": [1]}, 1, {"count": 2, "tokens": [4]}) is None
    assert C.counts_from({"prompt": [1]}, 1, {"count": 1, "tokens": ["4"]}) is None


def test_the_continuing_engine_s_events_read_as_the_first_engine_s() -> None:
    sent = C.Sent()
    sent.read(_event(_chat({"role": "assistant", "content": ""})) + _event(_chat({"content": " a"})),
              chat=True)
    rewriter = C.Rewriter(sent, C.Counts(prompt=7, generated=1), chat=True)
    engine = (_event(_chat({"role": "assistant", "content": ""}, rid="other", created=200))
              + _event(_chat({"content": " b"}, rid="other", created=200))
              + _event(_chat({"content": ""}, "stop", rid="other", created=200))
              + _event({"id": "other", "created": 200, "model": "m", "choices": [],
                        "usage": {"prompt_tokens": 8, "completion_tokens": 2,
                                  "total_tokens": 10}})
              + b"data: [DONE]\n\n")
    # fed in pieces that split events: nothing is written until an event is whole
    out = b"".join(rewriter.feed(engine[i:i + 7]) for i in range(0, len(engine), 7))
    events = _events(out)
    assert [e if e == "[DONE]" else (e["id"], e["created"]) for e in events] == [
        ("chat-1", 100), ("chat-1", 100), ("chat-1", 100), "[DONE]"]
    assert events[0]["choices"][0]["delta"] == {"content": " b"}  # no second role delta
    assert events[2]["usage"] == {"prompt_tokens": 7, "completion_tokens": 3,
                                  "total_tokens": 10}
    assert sent.text == " a b" and sent.done and sent.finish == "stop"


def test_completion_logprob_offsets_count_from_the_start_of_the_answer() -> None:
    sent = C.Sent()
    sent.read(_event(_completion(" abc")), chat=False)
    rewriter = C.Rewriter(sent, C.Counts(3, 1), chat=False)
    doc = _completion(" de")
    doc["choices"][0]["logprobs"] = {"text_offset": [0], "tokens": [" de"]}
    (event,) = _events(rewriter.feed(_event(doc)))
    assert event["choices"][0]["logprobs"]["text_offset"] == [4]


def test_an_error_event_or_unreadable_event_from_the_continuing_engine_passes_as_it_is() -> None:
    rewriter = C.Rewriter(C.Sent(), C.Counts(1, 0), chat=False)
    error = _event({"error": {"message": "boom", "code": 500}})
    assert rewriter.feed(error) == error
    assert rewriter.feed(b"data: {not json\n\n") == b"data: {not json\n\n"
    assert rewriter.feed(b": comment\n\n") == b""


def test_an_answer_whole_when_its_engine_failed_gets_the_end_it_lacks() -> None:
    sent = C.Sent()
    sent.read(_event(_completion(" a")), chat=False)
    out = _events(C.closing_events(sent, C.Counts(4, 3), False, True, "length"))
    assert out[0]["choices"][0] == {"index": 0, "finish_reason": "length", "text": ""}
    assert out[1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    assert out[2] == "[DONE]"
    sent.read(_event(_completion("", "stop")) + b"data: [DONE]\n\n", chat=False)
    assert C.closing_events(sent, C.Counts(4, 3), False, False, "length") == b""


def test_a_stream_with_an_event_that_is_not_json_is_not_continued() -> None:
    log = C.sent_log(chat=False, chunked=True)
    log.add(_chunk(_event(_completion(" one"))))
    log.add(_chunk(b"data: {not json\n\n"))
    assert C.read_back(log) is None
