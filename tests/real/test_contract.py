"""core/kv predicts what two live vLLM CPU engines report: hash, agent metadata, cache config.

The prediction starts from the tiny model's config.json and the launch plan the engines were
started with; the version is whatever GET /version says, exactly as the engine reports it.
"""

from __future__ import annotations

import pytest

from narwhal.core.kv.capture.endpoints import (
    parse_cache_config_info,
    parse_process_start_time,
    parse_version_reply,
)
from narwhal.core.kv.capture.logs import parse_startup_log
from narwhal.core.kv.capture.sidechannel import metadata_mismatches
from narwhal.core.kv.regions import region_fields
from narwhal.core.kv.versions import facts_for
from narwhal.node.nixl_probe import ProbeTarget, probe
from tests.fidelity import client
from tests.real.engines import MAX_MODEL_LEN, Engine
from tests.real.live import completion, predicted, prompt_ids
from tests.real.session import Pair

ROLES = ("prefill", "decode")


def _engine(pair: Pair, role: str) -> Engine:
    return pair.prefill if role == "prefill" else pair.decode


def _version(engine: Engine) -> str:
    return parse_version_reply(client.get(f"{engine.url}/version").body)


@pytest.mark.parametrize("role", ROLES)
def test_live_side_channel_hash_and_metadata_equal_the_prediction(pair: Pair, role: str) -> None:
    """The probe reads rank (0, 0) and every predictable field matches core/kv."""
    engine = _engine(pair, role)
    version = _version(engine)
    geometry = predicted(pair, role, version)
    target = ProbeTarget(alias=role, host="127.0.0.1", port=engine.spec.side_channel_port,
                         pp_size=1, tp_size=1, vllm_version=version)
    [(rank, reply)] = probe(target).items()
    assert rank == (0, 0)
    assert reply.compatibility_hash == geometry.compatibility_hash
    stage = geometry.stages[0].metadata
    assert metadata_mismatches(stage, reply.as_agent_metadata()) == []
    assert stage.num_blocks is not None  # --kv-cache-memory-bytes makes num_blocks predictable
    # The region fields vLLM 0.32.0 adds: one region per layer, one group, host memory.
    meta = reply.metadata
    assert list(meta) == list(facts_for(version).metadata_fields)
    regions = region_fields(geometry, memory="DRAM")
    assert {k: meta[k] for k in regions} == regions
    assert len(meta["kv_caches_base_addr"]) == stage.num_regions


def test_probing_leaves_the_listener_serving_handshakes(pair: Pair) -> None:
    """After probes of both engines, D can still hand-shake with P and P's id is the one probed."""
    version = _version(pair.prefill)
    target = ProbeTarget(alias="prefill", host="127.0.0.1",
                         port=pair.prefill.spec.side_channel_port, pp_size=1, tp_size=1,
                         vllm_version=version)
    probed = probe(target)[(0, 0)].metadata["engine_id"]
    prompt = prompt_ids(seed=5000, length=50)
    first = completion(pair.prefill.url, {
        "prompt": prompt, "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}})
    params = first["kv_transfer_params"]
    assert params["remote_engine_id"] == probed
    assert (params["remote_host"], params["remote_port"]) == (
        "127.0.0.1", pair.prefill.spec.side_channel_port)
    completion(pair.decode.url, {"prompt": prompt, "max_tokens": 2, "kv_transfer_params": params})
    assert probe(target)[(0, 0)].metadata["engine_id"] == probed


def test_decode_log_names_the_hash_core_kv_predicted(pair: Pair) -> None:
    """'NIXL compatibility check passed (hash: ...)' on D carries the predicted hash."""
    prompt = prompt_ids(seed=5100, length=20)
    params = completion(pair.prefill.url, {
        "prompt": prompt, "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}},
    )["kv_transfer_params"]
    completion(pair.decode.url, {"prompt": prompt, "max_tokens": 1, "kv_transfer_params": params})
    facts = parse_startup_log(pair.decode.log_text())
    geometry = predicted(pair, "prefill", _version(pair.prefill))
    assert facts.compatibility_hash_passed == geometry.compatibility_hash


@pytest.mark.parametrize("role", ROLES)
def test_cache_config_info_agrees_with_the_plan(pair: Pair, role: str) -> None:
    """vllm:cache_config_info parses, and block size, blocks and capacity match core/kv."""
    engine = _engine(pair, role)
    geometry = predicted(pair, role, _version(engine))
    text = client.get(f"{engine.url}/metrics").text
    [info] = parse_cache_config_info(text)
    capacity = geometry.capacity
    assert capacity is not None
    assert info.int_label("block_size") == geometry.block_size == 128
    assert info.labels["user_specified_block_size"] == "False"
    assert info.int_label("num_gpu_blocks") == capacity.num_blocks
    assert info.int_label("num_cpu_blocks") is None
    assert info.int_label("kv_cache_size_tokens") == capacity.kv_cache_size_tokens
    assert info.labels["kv_cache_max_concurrency"] == str(capacity.max_concurrency)
    assert info.int_label("kv_cache_memory_bytes") == geometry.plan.available_kv_bytes
    assert info.labels["cache_dtype"] == geometry.plan.kv_cache_dtype
    assert info.labels["enable_prefix_caching"] == str(geometry.plan.enable_prefix_caching)
    # Resolved in the engine core, never synced back to the API server's label.
    assert info.labels["kv_cache_layout"] == "None"
    assert parse_process_start_time(text) > 0


@pytest.mark.parametrize("role", ROLES)
def test_startup_log_states_the_predicted_layout_backend_and_capacity(
    pair: Pair, role: str
) -> None:
    """The startup log parses: LBHNC, CPU_ATTN, 'CPU KV cache size' tokens and concurrency."""
    engine = _engine(pair, role)
    geometry = predicted(pair, role, _version(engine))
    facts = parse_startup_log(engine.log_text())
    capacity = geometry.capacity
    assert capacity is not None
    assert facts.kv_cache_layout == geometry.kv_cache_layout == "LBHNC"
    assert facts.attention_backends == (geometry.stages[0].metadata.attn_backend_name,)
    assert facts.device == "CPU"
    assert facts.kv_cache_tokens == capacity.kv_cache_size_tokens
    assert facts.max_model_len == MAX_MODEL_LEN
    assert facts.max_concurrency == capacity.max_concurrency
