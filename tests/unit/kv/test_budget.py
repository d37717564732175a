"""The fabric budget: the anchor's vector, its extensions, and refusal of impossible workloads."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from narwhal.core.kv.budget import Workload, edge_budget, required_gbps, uniform_payload
from tests.unit.kv.helpers import DEEPSEEK, LLAMA, geometry


def test_anchor_vector_requires_0_01024_gbit_per_second() -> None:
    payload = uniform_payload(1000, 129, 128)
    budget = required_gbps(payload, Workload(prompt_tokens=129, handoffs_per_s=1.0, burst=2,
                                             transfer_budget_s=0.5, headroom=1.25))
    assert (payload, budget.peak_handoffs_per_s, budget.required_gbps) == (256000, 4.0, 0.01024)


def test_gqa_budget_is_the_same_at_tp1_and_tp8() -> None:
    load = Workload(prompt_tokens=1000)
    one = edge_budget(geometry("llama-3.1-8b", LLAMA), load)
    eight = edge_budget(geometry("llama-3.1-8b", LLAMA, tensor_parallel_size=8), load)
    assert one.payload_bytes_per_handoff == eight.payload_bytes_per_handoff == 132120576
    assert one.required_gbps == pytest.approx(8 * 132120576 * 1.25 / 1e9)


def test_mla_budget_at_tp8_is_eight_times_the_latent_because_every_rank_reads_it() -> None:
    load = Workload(prompt_tokens=1000)
    tp8 = edge_budget(geometry("deepseek-v3", DEEPSEEK, tensor_parallel_size=8,
                               attention_backend="FLASH_ATTN_MLA"), load)
    assert tp8.payload_bytes_per_handoff == 566673408


def test_hybrid_budget_counts_one_state_per_mamba_layer_not_per_token() -> None:
    g = geometry("qwen3-next-80b", "q", ssm_conv_state_layout="DS")
    short = edge_budget(g, Workload(prompt_tokens=2)).payload_bytes_per_handoff
    assert short == 12 * 544 * 2048 + 36 * (49152 + 1048576)


def test_heterogeneous_tp_budget_uses_the_consumers_geometry() -> None:
    load = Workload(prompt_tokens=1000)
    d2 = geometry("llama-3.1-8b", LLAMA, tensor_parallel_size=2)
    assert edge_budget(d2, load).payload_bytes_per_handoff == 2 * 66060288


@pytest.mark.parametrize("bad", [
    {"prompt_tokens": 0}, {"burst": 0}, {"handoffs_per_s": 0.0}, {"handoffs_per_s": -1.0},
    {"transfer_budget_s": math.nan}, {"headroom": math.inf}, {"headroom": 0.9},
])
def test_an_invalid_workload_cannot_produce_a_budget(bad: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        Workload.model_validate(bad)


def test_a_handoff_that_moves_nothing_cannot_pass_with_a_zero_budget() -> None:
    with pytest.raises(ValueError, match="no bytes"):
        required_gbps(0, Workload())
