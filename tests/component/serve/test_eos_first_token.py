"""A model whose first token is EOS: the producer must still keep the KV for the consumer.

vLLM's connector keeps a producer's blocks only for a request that stopped on its token limit;
one that sampled EOS (or a stop string) finishes as "stop" with no kv_transfer_params. The
emulator does the same. The router's prefill leg therefore ignores EOS and stop sequences (its
token is discarded anyway), and the client's own stop rules apply on the decode leg."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from narwhal.lab.engine.testing import RunningEngine
from tests.component.serve.harness import Router, call
from tests.component.serve.test_with_emulator import ENGINE_ARGS, _pulled_tokens, emulator_pd_fleet

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def eos_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningEngine, Router]]:
    with emulator_pd_fleet(tmp_path_factory.mktemp("eos"),
                           [*ENGINE_ARGS, "--emu-eos-probability", "1"]) as (_, decode, router, _):
        yield decode, router


@pytest.mark.parametrize("stream", [False, True])
def test_a_first_token_eos_is_answered_by_the_decode_engine_not_refused(
        eos_fleet: tuple[RunningEngine, Router], stream: bool) -> None:
    decode, router = eos_fleet
    before = _pulled_tokens(decode)
    reply = call(router.port, "POST", "/v1/completions",
                 {"model": "tiny", "prompt": "the sea and the ships upon it, far out",
                  "max_tokens": 8, "stream": stream})
    assert reply.status == 200, reply.body[:500]
    if stream:
        events = reply.events()
        assert events[-1] == "[DONE]"
        finish = [e["choices"][0]["finish_reason"] for e in events[:-1] if e.get("choices")]
        assert finish[-1] == "stop"
    else:
        assert json.loads(reply.body)["choices"][0]["finish_reason"] == "stop"
    assert _pulled_tokens(decode) > before  # the consumer pulled the prompt's KV


def test_the_clients_ignore_eos_reaches_the_decode_engine(
        eos_fleet: tuple[RunningEngine, Router]) -> None:
    _, router = eos_fleet
    reply = call(router.port, "POST", "/v1/completions",
                 {"model": "tiny", "prompt": "the sea and the ships", "max_tokens": 5,
                  "ignore_eos": True})
    assert reply.status == 200, reply.body[:500]
    doc = json.loads(reply.body)
    assert doc["choices"][0]["finish_reason"] == "length" and doc["usage"]["completion_tokens"] == 5
