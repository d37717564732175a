"""A real P/D handoff: KV computed on P, pulled by D over NIXL, decodes like a local prefill.

P and D are both `kv_both`; the request decides the role. P prefills with `max_tokens: 1` and
`do_remote_decode`, returns `kv_transfer_params`; D gets the same prompt with those params and
pulls the blocks. The reference decode runs on D too, with a `cache_salt` so it cannot reuse
the pulled blocks from D's prefix cache: it is a full local prefill of the same prompt.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from narwhal.core.kv.transfer import request_transfer
from tests.fidelity import client
from tests.fidelity.requests import PREFILL_PARAMS
from tests.real.live import Counters, by_source, completion, predicted, prompt_ids, settled
from tests.real.session import Pair

DECODE_TOKENS = 16


def _prefill(pair: Pair, prompt: list[int]) -> dict[str, Any]:
    return completion(pair.prefill.url, {
        "prompt": prompt, "max_tokens": 1, "temperature": 0, "return_token_ids": True,
        "kv_transfer_params": PREFILL_PARAMS})


def _decode(url: str, prompt: list[int], **extra: Any) -> dict[str, Any]:
    return completion(url, {
        "prompt": prompt, "max_tokens": DECODE_TOKENS, "temperature": 0, "logprobs": 1,
        "ignore_eos": True, "return_token_ids": True, **extra})


@pytest.mark.parametrize("length", [40, 128, 300])
def test_decode_after_a_real_nixl_pull_equals_a_local_decode_token_for_token_and_logprob(
    pair: Pair, length: int
) -> None:
    """Tokens and logprobs after a handoff are bit-identical to D prefilling the prompt itself."""
    prompt = prompt_ids(seed=1000 + length, length=length)
    first = _prefill(pair, prompt)
    params = first["kv_transfer_params"]
    assert params["remote_num_tokens"] == length

    before = Counters.read(pair.decode.url)
    handed = _decode(pair.decode.url, prompt, kv_transfer_params=params)
    middle = Counters.read(pair.decode.url)
    local = _decode(pair.decode.url, prompt, cache_salt=f"local-{uuid.uuid4()}")
    after = Counters.read(pair.decode.url)

    got, want = handed["choices"][0], local["choices"][0]
    assert got["token_ids"] == want["token_ids"]
    assert got["logprobs"]["token_logprobs"] == want["logprobs"]["token_logprobs"]
    assert got["logprobs"]["top_logprobs"] == want["logprobs"]["top_logprobs"]
    # P sampled the first token from the same logits D recomputes for its first step.
    assert first["choices"][0]["token_ids"] == got["token_ids"][:1]
    # The reference really was a local prefill, not a prefix-cache hit on pulled blocks.
    assert by_source(after, middle) == {"local_compute": length, "local_cache_hit": 0,
                                        "external_kv_transfer": 0}
    assert by_source(middle, before)["local_compute"] == 0


@pytest.mark.parametrize("length", [2, 40, 127, 128, 129, 300])
def test_consumer_counts_every_pulled_prompt_token_as_external_and_moves_whole_blocks(
    pair: Pair, length: int
) -> None:
    """D's external_kv_transfer counter rises by the prompt length; bytes are whole blocks."""
    version = client.get(f"{pair.decode.url}/version").json()["version"]
    geometry = predicted(pair, "decode", version)
    expected = request_transfer(geometry, length)
    prompt = prompt_ids(seed=2000 + length, length=length)
    params = _prefill(pair, prompt)["kv_transfer_params"]
    assert [len(group) for group in params["remote_block_ids"]] == (
        expected.stages[0].blocks_per_group)

    before = Counters.read(pair.decode.url)
    _decode(pair.decode.url, prompt, kv_transfer_params=params)
    after = Counters.read(pair.decode.url)

    assert by_source(after, before) == {"local_compute": 0, "local_cache_hit": 0,
                                        "external_kv_transfer": length}
    assert after.delta(before, "vllm:nixl_xfer_time_seconds_count") == 1
    assert after.delta(before, "vllm:nixl_bytes_transferred_sum") == expected.total_bytes
    # NIXL's telemetry counts descriptors after it merges adjacent ones (two contiguous blocks
    # of one layer region read as one), so core/kv's one-per-block count is the upper bound.
    regions = geometry.stages[0].metadata.num_regions
    descriptors = after.delta(before, "vllm:nixl_num_descriptors_sum")
    assert regions <= descriptors <= expected.stages[0].descriptors_per_rank
    assert after.delta(before, "vllm:nixl_num_failed_transfers_total") == 0


def test_one_token_prompt_is_pulled_but_counted_as_local_compute(pair: Pair) -> None:
    """vLLM 0.32.0 quirk the emulator must copy: a 1-token prompt moves one block over NIXL,
    yet D reports it under local_compute, not external_kv_transfer."""
    prompt = prompt_ids(seed=3001, length=1)
    params = _prefill(pair, prompt)["kv_transfer_params"]
    before = Counters.read(pair.decode.url)
    _decode(pair.decode.url, prompt, kv_transfer_params=params)
    after = Counters.read(pair.decode.url)
    assert by_source(after, before) == {"local_compute": 1, "local_cache_hit": 0,
                                        "external_kv_transfer": 0}
    assert after.delta(before, "vllm:nixl_xfer_time_seconds_count") == 1
    assert after.delta(before, "vllm:prompt_tokens_cached_by_source_total", source="p2p") == 1


def test_no_transfer_failed_on_either_engine_during_good_handoffs(
    pair: Pair, provoked_failures: dict[str, int]
) -> None:
    """Good handoffs never move vllm:nixl_num_failed_transfers_total; only the failures the
    suite provoked are counted (vLLM counts 1 or 2 per failed handoff: one per failed
    handshake attempt, and it retries once for the request's second id)."""
    failed = "vllm:nixl_num_failed_transfers_total"
    start = settled(pair.decode.url, failed)
    for seed in range(4000, 4003):
        prompt = prompt_ids(seed=seed, length=64)
        params = _prefill(pair, prompt)["kv_transfer_params"]
        _decode(pair.decode.url, prompt, kv_transfer_params=params)
    assert settled(pair.decode.url, failed) == start
    assert provoked_failures["decode"] <= start <= 2 * provoked_failures["decode"]
    assert Counters.read(pair.prefill.url).get(failed) == 0
