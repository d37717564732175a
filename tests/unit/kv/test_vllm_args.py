"""A launch record's `vllm serve` arguments read as core/kv's LaunchPlan (Gate C's prediction)."""

from __future__ import annotations

import pytest

from narwhal.core.errors import InputError
from narwhal.core.kv.vllm_args import launch_plan_from_args


def _plan(*args: str) -> dict[str, object]:
    return launch_plan_from_args(list(args), name="e", vllm_version="0.32.0").model_dump()


def test_the_shaping_flags_in_every_spelling_vllm_accepts() -> None:
    plan = _plan("/m", "--block-size=16", "-tp", "2", "--kv_cache_dtype", "fp8",
                 "--max-model-len", "4096", "--kv-cache-memory-bytes", "64M", "--dtype",
                 "float16", "--no-enable-prefix-caching", "--served-model-name", "x",
                 "--port", "8000", "--gpu-memory-utilization", "0.8")
    assert plan["model"] == "/m" and plan["block_size"] == 16
    assert plan["tensor_parallel_size"] == 2 and plan["kv_cache_dtype"] == "fp8"
    assert plan["max_model_len"] == 4096 and plan["available_kv_bytes"] == 64 << 20
    assert plan["dtype"] == "float16" and plan["enable_prefix_caching"] is False


def test_the_last_of_a_repeated_flag_wins_as_in_vllm() -> None:
    assert _plan("/m", "--block-size", "128", "--block-size", "16")["block_size"] == 16


def test_flags_that_do_not_shape_the_cache_do_not_swallow_the_model() -> None:
    assert _plan("--port", "8000", "/m")["model"] == "/m"


@pytest.mark.parametrize("args, words", [
    (["/m", "--block-size", "x"], "--block-size: 'x' cannot be read"),
    (["/m", "--block-size"], "--block-size has no value"),
    (["--dtype", "float16"], "no model"),
    (["/m", "/n"], "a second positional argument '/n'"),
    (["/m", "--kv-cache-dtype", "fp3"], "not modelled"),
])
def test_an_unreadable_shaping_flag_is_named_never_guessed(args: list[str], words: str) -> None:
    with pytest.raises(InputError) as info:
        launch_plan_from_args(args, name="e", vllm_version="0.32.0")
    assert words in str(info.value)
