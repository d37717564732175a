"""Reference vectors V1-V3 (vllm-kv-contract.md §11) reproduce exactly; invalid TP is refused."""

from __future__ import annotations

import pytest

from narwhal.core.errors import InputError
from narwhal.core.kv.arch import arch_from_config, valid_tp_sizes
from narwhal.core.kv.geometry import plan_geometry
from narwhal.core.kv.plan import LaunchPlan
from narwhal.core.kv.transfer import request_transfer
from tests.unit.kv.helpers import DEEPSEEK, LLAMA, QWEN, config, geometry

V1_HASH = "c0e418084b28399f9e8e87432772956394198b766dfba122253930180e1d32fd"


@pytest.mark.parametrize(
    ("tp", "h_loc", "per_layer", "per_token", "page", "per_block", "per_rank", "descriptors"),
    [(1, 8, 4096, 131072, 65536, 2097152, 132120576, 2016),
     (8, 1, 512, 16384, 8192, 262144, 16515072, 2016)],
)
def test_llama_8b_geometry_matches_v1_at_every_step(
    tp: int, h_loc: int, per_layer: int, per_token: int, page: int, per_block: int,
    per_rank: int, descriptors: int,
) -> None:
    g = geometry("llama-3.1-8b", LLAMA, tensor_parallel_size=tp)
    stage = g.stages[0]
    assert (g.heads_per_rank, g.content_bytes) == (h_loc, 512)
    assert g.bytes_per_token_per_layer == per_layer
    assert (stage.bytes_per_token, stage.bytes_per_block) == (per_token, per_block)
    assert [(x.kind, len(x.layers), x.page_bytes) for x in g.groups] == [("full", 32, page)]
    assert stage.metadata.block_lens == [page] * 32 and stage.metadata.num_regions == 32
    assert stage.metadata.block_size == 16 and g.kv_cache_layout == "LBHNC"
    t = request_transfer(g, 1000)
    assert t.stages[0].blocks_per_group == [63]
    assert (t.stages[0].bytes_per_rank, t.total_bytes) == (per_rank, 132120576)
    assert t.stages[0].descriptors_per_rank == descriptors
    assert g.compatibility_hash == V1_HASH


@pytest.mark.parametrize(("tokens", "expected"),
                         [(1, 2097152), (16, 2097152), (17, 4194304), (8192, 1073741824)])
def test_partially_filled_last_block_still_crosses_the_fabric(tokens: int, expected: int) -> None:
    g = geometry("llama-3.1-8b", LLAMA)
    assert request_transfer(g, tokens).stages[0].bytes_per_rank == expected


def test_capacity_prediction_matches_the_log_line_vllm_prints() -> None:
    g = geometry("llama-3.1-8b", LLAMA, available_kv_bytes=64424509440, max_model_len=131072)
    assert g.capacity is not None
    assert (g.capacity.num_blocks, g.capacity.blocks_per_request) == (30720, 8192)
    assert (g.capacity.max_concurrency, g.capacity.kv_cache_size_tokens) == (3.75, 491520)


@pytest.mark.parametrize(
    ("change", "expected"),
    [({"disable_hybrid_kv_cache_manager": True},
      "5ffbf07463e69a82667fb02026bbe280530124553089203d5575df2dfee2e433"),
     ({"transfer_mode": "push"},
      "dcd22b075b08abd2c907b63e2d87cab6b2a54cdf9d8e4d3c2a2acdf6c2fe3c49"),
     ({"kv_cache_dtype": "fp8"},
      "7bb70546d463b135500b4f3ed4a18b38b76c510303e88dd6e1046449e44ffc99"),
     ({"vllm_version": "0.33.0"},
      "6f60bd7dfc8c0370d6c2ee5c2831ab5bafaf8e0d73e67a21816ecb7e0c8e0c7f")],
)
def test_each_hashed_setting_changes_the_hash_exactly_as_vllm_does(
    change: dict[str, object], expected: str
) -> None:
    assert geometry("llama-3.1-8b", LLAMA, **change).compatibility_hash == expected


@pytest.mark.parametrize(("tp", "per_token", "page", "per_block", "per_rank"),
                         [(1, 12288, 8192, 196608, 12386304), (2, 6144, 4096, 98304, 6193152)])
def test_qwen_half_b_geometry_matches_v2(
    tp: int, per_token: int, page: int, per_block: int, per_rank: int
) -> None:
    g = geometry("qwen2.5-0.5b", QWEN, tensor_parallel_size=tp)
    assert g.architecture.head_size == 64 and g.architecture.layer_kinds == {"full": 24}
    assert (g.stages[0].bytes_per_token, g.groups[0].page_bytes) == (per_token, page)
    assert g.stages[0].bytes_per_block == per_block
    t = request_transfer(g, 1000)
    assert (t.stages[0].bytes_per_rank, t.total_bytes) == (per_rank, 12386304)
    assert g.compatibility_hash == (
        "186081e46054a93fa89939feeff362db11ec7af908e2599c912308e5b7f4748a")


@pytest.mark.parametrize("tp", [4, 8])
def test_qwen_half_b_at_tp8_is_rejected_with_the_reason_and_valid_sizes(tp: int) -> None:
    with pytest.raises(InputError) as err:
        geometry("qwen2.5-0.5b", QWEN, tensor_parallel_size=tp)
    text = str(err.value)
    assert f"num_attention_heads 14 is not divisible by TP {tp}" in text
    assert "1, 2, 14" in text


def test_valid_tp_sizes_for_qwen_half_b_are_1_2_and_14() -> None:
    assert valid_tp_sizes(arch_from_config(config("qwen2.5-0.5b"))) == [1, 2, 14]


@pytest.mark.parametrize(("tp", "kv_dtype", "per_layer", "per_rank", "total", "hash_"), [
    (1, "auto", 1152, 70834176, 70834176,
     "f19182f8e05b4b58aae3ea69bed48c66f302fc17065a79030a9829ddf873e170"),
    (8, "auto", 1152, 70834176, 566673408,
     "f19182f8e05b4b58aae3ea69bed48c66f302fc17065a79030a9829ddf873e170"),
    (8, "fp8", 576, 35417088, 283336704, None),
])
def test_deepseek_v3_mla_matches_v3_and_every_rank_reads_the_latent(
    tp: int, kv_dtype: str, per_layer: int, per_rank: int, total: int, hash_: str | None
) -> None:
    g = geometry("deepseek-v3", DEEPSEEK, tensor_parallel_size=tp, kv_cache_dtype=kv_dtype,
                 attention_backend="FLASH_ATTN_MLA")
    assert (g.architecture.head_size, g.heads_per_rank, g.bytes_per_token_per_layer) == (
        576, 1, per_layer)
    if kv_dtype == "auto":
        assert (g.stages[0].bytes_per_token, g.groups[0].page_bytes) == (70272, 18432)
        assert g.stages[0].bytes_per_block == 1124352
        assert g.hash_factors["num_kv_heads"] == 128
    assert g.kv_cache_layout == "LBNHC"
    t = request_transfer(g, 1000)
    assert (t.stages[0].bytes_per_rank, t.total_bytes) == (per_rank, total)
    if hash_:
        assert g.compatibility_hash == hash_


def test_deepseek_v3_pp2_splits_61_layers_31_and_30() -> None:
    g = geometry("deepseek-v3", DEEPSEEK, pipeline_parallel_size=2,
                 attention_backend="FLASH_ATTN_MLA")
    assert [s.metadata.num_regions for s in g.stages] == [31, 30]
    assert g.hash_factors["num_hidden_layers"] == 61


@pytest.mark.parametrize(("backend", "block"), [("FLASHMLA", 64), ("CUTLASS_MLA", 128)])
def test_mla_backends_that_cannot_do_16_raise_the_block_size(backend: str, block: int) -> None:
    g = geometry("deepseek-v3", DEEPSEEK, attention_backend=backend)
    assert (g.block_size, g.stages[0].metadata.block_size) == (block, block)


def test_mla_model_without_a_pinned_backend_is_refused_with_the_fix() -> None:
    with pytest.raises(InputError, match="pin --attention-backend"):
        geometry("deepseek-v3", DEEPSEEK)


@pytest.mark.parametrize(("tp", "block", "conv", "ssm", "blocks"),
                         [(1, 544, 49152, 1048576, 2), (8, 144, 6144, 131072, 7)])
def test_qwen3_next_hybrid_block_size_depends_on_tp_as_vllm_aligns_it(
    tp: int, block: int, conv: int, ssm: int, blocks: int
) -> None:
    g = geometry("qwen3-next-80b", "Qwen/Qwen3-Next-80B-A3B-Instruct", tensor_parallel_size=tp)
    assert (g.block_size, g.hybrid_aligned) == (block, True)
    assert g.stages[0].metadata.ssm_sizes == [conv, ssm]
    assert [(x.kind, len(x.layers)) for x in g.groups] == [("gdn", 12)] * 3 + [("full", 12)]
    assert g.stages[0].metadata.num_regions == 12
    assert g.hash_factors["attn_backend_name"] == "GDN_ATTN"
    t = request_transfer(g, 1000)
    assert t.transferred_tokens == 999  # P drops the last prompt token for Mamba hybrids
    assert t.stages[0].blocks_per_group == [1, 1, 1, blocks]
    assert t.stages[0].bytes_per_rank == blocks * 12 * block * g.bytes_per_token_per_layer + 36 * (
        conv + ssm)


def test_sliding_window_layers_send_only_their_window_when_hma_is_on() -> None:
    cfg = {"model_type": "gpt_oss", "num_hidden_layers": 4, "num_attention_heads": 8,
           "num_key_value_heads": 8, "head_dim": 64, "sliding_window": 128,
           "torch_dtype": "bfloat16",
           "layer_types": ["sliding_attention", "full_attention"] * 2}
    on = plan_geometry(cfg, LaunchPlan(model="m"))
    assert [(x.kind, x.layers) for x in on.groups] == [("sliding", [0, 2]), ("full", [1, 3])]
    assert on.stages[0].metadata.num_regions == 2
    assert request_transfer(on, 1000).stages[0].blocks_per_group == [9, 63]
    off = plan_geometry(cfg, LaunchPlan(model="m", disable_hybrid_kv_cache_manager=True))
    assert [(x.kind, len(x.layers)) for x in off.groups] == [("full", 4)]
    assert request_transfer(off, 1000).stages[0].blocks_per_group == [63]
