"""Invariants that must hold for any model shape, not just the reference vectors."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.core.kv.geometry import plan_geometry
from narwhal.core.kv.pair import check_pair
from narwhal.core.kv.plan import LaunchPlan
from narwhal.core.kv.transfer import request_transfer

FAST = settings(max_examples=40, deadline=None)


@st.composite
def gqa_config(draw: st.DrawFn) -> dict[str, Any]:
    kv = draw(st.sampled_from([1, 2, 4, 8, 16]))
    group = draw(st.sampled_from([1, 2, 4]))
    return {"model_type": "llama", "num_hidden_layers": draw(st.integers(1, 48)),
            "num_attention_heads": kv * group, "num_key_value_heads": kv,
            "head_dim": draw(st.sampled_from([64, 128, 256])),
            "torch_dtype": draw(st.sampled_from(["bfloat16", "float16", "float32"]))}


def _divisors_up_to_k(cfg: dict[str, Any]) -> list[int]:
    k = cfg["num_key_value_heads"]
    return [tp for tp in (1, 2, 4, 8, 16) if tp <= k]


@FAST
@given(cfg=gqa_config(), tokens=st.integers(1, 5000), data=st.data())
def test_total_bytes_over_ranks_do_not_depend_on_tp_for_full_attention(
    cfg: dict[str, Any], tokens: int, data: st.DataObject
) -> None:
    tp = data.draw(st.sampled_from(_divisors_up_to_k(cfg)))
    one = plan_geometry(cfg, LaunchPlan(model="m"))
    many = plan_geometry(cfg, LaunchPlan(model="m", tensor_parallel_size=tp))
    assert request_transfer(one, tokens).total_bytes == request_transfer(many, tokens).total_bytes
    assert one.stages[0].bytes_per_token == tp * many.stages[0].bytes_per_token


@FAST
@given(cfg=gqa_config(), block=st.sampled_from([16, 32, 64, 128, 256]), data=st.data())
def test_hash_does_not_depend_on_tp_or_block_size(
    cfg: dict[str, Any], block: int, data: st.DataObject
) -> None:
    tp = data.draw(st.sampled_from(_divisors_up_to_k(cfg)))
    base = plan_geometry(cfg, LaunchPlan(model="m"))
    other = plan_geometry(cfg, LaunchPlan(model="m", tensor_parallel_size=tp, block_size=block))
    assert base.compatibility_hash == other.compatibility_hash


_PLAN_CHOICES = st.fixed_dictionaries({
    "model": st.sampled_from(["a/b", "/models/b"]),
    "kv_cache_layout": st.sampled_from([None, "LBNHC"]),
    "transfer_mode": st.sampled_from(["pull", "push"]),
    "disable_hybrid_kv_cache_manager": st.sampled_from([None, True]),
    "tensor_parallel_size": st.sampled_from([1, 2, 4, 8]),
})
_SYMMETRIC = ("compatibility_hash", "tp_divisibility", "kv_cache_layout")


@FAST
@given(a=_PLAN_CHOICES, b=_PLAN_CHOICES)
def test_hash_layout_and_tp_verdicts_are_the_same_in_both_directions(
    a: dict[str, Any], b: dict[str, Any]
) -> None:
    cfg = {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 128, "torch_dtype": "bfloat16"}
    ga = plan_geometry(cfg, LaunchPlan(name="a", **a))
    gb = plan_geometry(cfg, LaunchPlan(name="b", **b))
    ab, ba = check_pair(ga, gb), check_pair(gb, ga)
    assert ab.hash_equal == ba.hash_equal
    for check in ("compatibility_hash", "tp_divisibility"):
        assert sorted(f.factor for f in ab.findings if f.check == check) == sorted(
            f.factor for f in ba.findings if f.check == check)
    same_layout = ga.kv_cache_layout == gb.kv_cache_layout
    assert any("expects same" in f.message for f in ab.findings) is (not same_layout)
    assert any("expects same" in f.message for f in ba.findings) is (not same_layout)
