"""Pair checks predict vLLM's handshake verdict and name both engines, the factor and the fix."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.core.kv.geometry import Geometry
from narwhal.core.kv.pair import check_fleet, check_pair
from narwhal.core.kv.transfer import request_transfer
from tests.unit.kv.helpers import LLAMA, geometry


def llama(name: str, **plan: Any) -> Geometry:
    return geometry("llama-3.1-8b", LLAMA, name=name, **plan)


def test_identical_engines_are_compatible_in_both_directions() -> None:
    reports = check_fleet([llama("p"), llama("d")])
    assert [(r.producer, r.consumer, r.compatible) for r in reports] == [
        ("p", "d", True), ("d", "p", True)]


def test_model_string_mismatch_names_the_factor_both_engines_and_the_fix() -> None:
    p = llama("p")
    d = geometry("llama-3.1-8b", "/models/llama-8b", name="d")
    report = check_pair(p, d)
    assert not report.hash_equal
    [finding] = report.findings
    assert (finding.check, finding.factor) == ("compatibility_hash", "model")
    assert "producer p -> consumer d" in finding.message and "/models/llama-8b" in finding.message
    assert "identical --model" in finding.fix


def test_every_differing_hash_factor_is_listed_not_just_the_first() -> None:
    report = check_pair(llama("p"), llama("d", disable_hybrid_kv_cache_manager=True,
                                              transfer_mode="push"))
    assert {f.factor for f in report.findings} == {"is_hma_enabled", "transfer_mode"}


def test_heterogeneous_tp_two_to_four_passes_and_d_reads_its_own_page() -> None:
    p, d = llama("p", tensor_parallel_size=2), llama("d", tensor_parallel_size=4)
    report = check_pair(p, d)
    assert report.compatible and report.tp_ratio == 2
    assert (p.groups[0].page_bytes, d.groups[0].page_bytes) == (32768, 16384)
    t = request_transfer(d, 1000)
    assert (t.stages[0].bytes_per_rank, t.total_bytes) == (33030144, 132120576)


def test_heterogeneous_tp_four_to_two_passes_with_d_reading_two_half_blocks() -> None:
    report = check_pair(llama("p", tensor_parallel_size=4), llama("d", tensor_parallel_size=2))
    assert report.compatible and report.tp_ratio == -2
    t = request_transfer(llama("d", tensor_parallel_size=2), 1000)
    assert (t.stages[0].bytes_per_rank, t.total_bytes) == (66060288, 132120576)


def test_tp_sizes_that_do_not_divide_each_other_are_refused() -> None:
    g2 = geometry("qwen2.5-0.5b", "q", name="a", tensor_parallel_size=2)
    g14 = geometry("qwen2.5-0.5b", "q", name="b", tensor_parallel_size=14)
    assert check_pair(g2, g14).compatible  # 14/2 = 7
    g4 = llama("p", tensor_parallel_size=4)
    g8 = llama("d", tensor_parallel_size=8)
    assert check_pair(g4, g8).compatible


def test_consumer_block_must_be_a_multiple_of_the_producer_block() -> None:
    report = check_pair(llama("p", block_size=32), llama("d", block_size=16))
    [finding] = report.findings
    assert finding.factor == "block_size"
    assert "Local block size 16 is not divisible by remote block size 32" in finding.message
    assert check_pair(llama("p", block_size=16), llama("d", block_size=32)).compatible


def test_layout_mismatch_fails_even_at_equal_tp() -> None:
    report = check_pair(llama("p"), llama("d", kv_cache_layout="NHD"))
    assert [f.check for f in report.findings] == ["kv_cache_layout"]
    assert "Heterogeneous TP expects same kv_cache_layout" in report.findings[0].message


def test_heterogeneous_tp_needs_block_contiguous_heads_on_the_consumer() -> None:
    p = llama("p", tensor_parallel_size=2, kv_cache_layout="NHD")
    d = llama("d", tensor_parallel_size=4, kv_cache_layout="NHD")
    [finding] = check_pair(p, d).findings
    assert "requires contiguous heads" in finding.message


def test_producer_replicating_kv_heads_cannot_feed_a_narrower_consumer() -> None:
    # Qwen2.5-0.5B has 2 KV heads: TP 14 replicates them, TP 2 splits them.
    p = geometry("qwen2.5-0.5b", "q", name="p", tensor_parallel_size=14)
    d = geometry("qwen2.5-0.5b", "q", name="d", tensor_parallel_size=2)
    checks = {f.check for f in check_pair(p, d).findings}
    assert "gqa_replication" in checks
    assert check_pair(d, p).compatible


def test_pull_mode_producer_with_pp_is_refused_in_v0_29() -> None:
    report = check_pair(llama("p", pipeline_parallel_size=2), llama("d"))
    assert any(f.check == "pipeline_parallel" and "--pipeline-parallel-size 1" in f.fix
               for f in report.findings)


def test_mamba_hybrids_need_ds_conv_state_layout_on_both_engines() -> None:
    name = "qwen3-next-80b"
    p = geometry(name, "Qwen/Qwen3-Next-80B-A3B-Instruct", name="p")
    d = geometry(name, "Qwen/Qwen3-Next-80B-A3B-Instruct", name="d", ssm_conv_state_layout="DS")
    findings = check_pair(p, d).findings
    assert [f.check for f in findings] == ["mamba_conv_state_layout"]
    assert "VLLM_SSM_CONV_STATE_LAYOUT=DS on p" in findings[0].fix


def test_hybrid_engines_at_different_tp_fail_on_hash_free_geometry() -> None:
    name, model = "qwen3-next-80b", "Qwen/Qwen3-Next-80B-A3B-Instruct"
    p = geometry(name, model, name="p", tensor_parallel_size=1, ssm_conv_state_layout="DS")
    d = geometry(name, model, name="d", tensor_parallel_size=8, ssm_conv_state_layout="DS")
    report = check_pair(p, d)
    assert report.hash_equal  # block size is not hashed ...
    assert {f.check for f in report.findings} == {"kernel_block_size"}  # ... 144 % 544 != 0


@pytest.mark.parametrize("backend", ["FLASHMLA", "CUTLASS_MLA"])
def test_mla_consumer_with_small_blocks_cannot_read_a_large_block_producer(backend: str) -> None:
    p = geometry("deepseek-v3", "ds", name="p", attention_backend=backend, block_size=128)
    d = geometry("deepseek-v3", "ds", name="d", attention_backend=backend, block_size=128,
                 tensor_parallel_size=8)
    assert check_pair(p, d).compatible  # MLA: latent replicated, layout check skipped
