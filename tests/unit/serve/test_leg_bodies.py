"""The two leg bodies carry the client's request with exactly the router's changes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from narwhal.serve.router.request.call import BadRequest, Call, check_body
from narwhal.serve.router.request.decisions import REPLIED
from tests.unit.serve.clients import unconnected_client

KV = {"do_remote_prefill": True, "remote_block_ids": [[1, 2], [3]], "remote_engine_id": "é-1",
      "remote_port": 5600, "kv_scale": 0.125, "remote_blocks_expiry_time": None}


def _call(body: dict[str, Any], chat: bool = False) -> Call:
    raw = json.dumps(body).encode()
    return Call(check_body(raw, chat, "m"), chat, b"rid-1", None, unconnected_client())


def test_the_prefill_leg_asks_for_one_unstreamed_token_and_a_kept_kv() -> None:
    call = _call({"model": "m", "prompt": "hi", "max_tokens": 50, "stream": True,
                  "stream_options": {"include_usage": True}, "min_tokens": 5,
                  "temperature": 0.3, "logit_bias": {"5": 1}})
    body = json.loads(call.prefill_body())
    assert body == {"model": "m", "prompt": "hi", "max_tokens": 1, "stream": False,
                    "ignore_eos": True, "kv_transfer_params": {"do_remote_decode": True},
                    "temperature": 0.3, "logit_bias": {"5": 1}}


def test_eos_and_stop_sequences_apply_to_the_decode_leg_only() -> None:
    """A producer that stops on EOS or a stop string keeps no KV (no handoff, a 502), while its
    one token is discarded anyway: the consumer samples its own first token."""
    client = {"model": "m", "prompt": "hi", "max_tokens": 8, "ignore_eos": False,
              "stop": ["\n", "END"], "stop_token_ids": [2]}
    call = _call(client)
    prefill = json.loads(call.prefill_body())
    assert prefill["ignore_eos"] is True
    assert "stop" not in prefill and "stop_token_ids" not in prefill
    decode = json.loads(call.decode_body(None))
    assert decode["ignore_eos"] is False and decode["stop"] == ["\n", "END"]
    assert decode["stop_token_ids"] == [2]


def test_a_chat_prefill_caps_max_completion_tokens_too() -> None:
    call = _call({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 9},
                 chat=True)
    body = json.loads(call.prefill_body())
    assert body["max_tokens"] == 1 and body["max_completion_tokens"] == 1
    assert body["messages"] == [{"role": "user", "content": "x"}]


def test_the_decode_leg_keeps_client_limits_and_carries_the_producers_params_exactly() -> None:
    call = _call({"model": "m", "prompt": "hi", "max_tokens": 50, "min_tokens": 5,
                  "stream": True, "stream_options": {"include_usage": True}, "seed": 7})
    kv = json.dumps(KV, separators=(",", ":")).encode()
    body = json.loads(call.decode_body(kv))
    assert body["kv_transfer_params"] == KV
    assert body["max_tokens"] == 50 and body["min_tokens"] == 5 and body["seed"] == 7
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_a_non_streaming_client_gets_a_streamed_decode_leg_that_reports_usage() -> None:
    body = json.loads(_call({"prompt": "hi"}).decode_body(None))
    assert body == {"prompt": "hi", "stream": True, "stream_options": {"include_usage": True}}


def test_a_client_body_with_only_router_keys_still_makes_valid_legs() -> None:
    call = _call({"prompt": [1, 2, 3]})
    assert json.loads(call.prefill_body())["prompt"] == [1, 2, 3]
    tokenize = json.loads(call.tokenize_body())
    assert tokenize == {"prompt": [1, 2, 3]}


@pytest.mark.parametrize(("body", "param", "status"), [
    ({"prompt": None}, "prompt", 400),
    ({"prompt": [[1], [2]]}, "prompt", 400),
    ({"prompt": "x", "max_completion_tokens": True}, "max_completion_tokens", 400),
    ({"prompt": "x", "max_tokens": -3}, "max_tokens", 400),
    ({"prompt": "x", "model": 5}, "model", 404),
])
def test_check_body_names_the_field(body: dict[str, Any], param: str, status: int) -> None:
    with pytest.raises(BadRequest) as info:
        check_body(json.dumps(body).encode(), False, "m")
    assert (info.value.param, info.value.status) == (param, status)


def test_a_journal_row_holds_no_request_content() -> None:
    call = _call({"prompt": "private words", "max_tokens": 3})
    call.decision = REPLIED
    row = call.row()
    assert "private" not in json.dumps(row)
    assert row["request_id"] == "rid-1" and row["max_tokens"] == 3
    assert (row["outcome"], row["rule"]) == ("ok", "replied")
