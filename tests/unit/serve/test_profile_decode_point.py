"""A decode point as the engine recorded it: the batch it really ran, not the one the profiler
started, and engines grouped by host so co-located engines are not measured together."""

from __future__ import annotations

import pytest

from narwhal.serve.engine_client import MetricsPage
from narwhal.serve.profile_cli import by_host
from narwhal.serve.profiler.stream import TimedStream
from narwhal.serve.profiler.sweep import _engine_point

LABELS = '{engine="0",model_name="tiny-llama"}'


def page(decode_count: int, decode_sum: float, steps: int) -> MetricsPage:
    """The two vLLM families the point reads, in vLLM's exposition text."""
    text = (
        "# HELP vllm:request_decode_time_seconds Decode phase time.\n"
        "# TYPE vllm:request_decode_time_seconds histogram\n"
        f'vllm:request_decode_time_seconds_bucket{{engine="0",le="+Inf",model_name="tiny-llama"}} {decode_count}\n'
        f"vllm:request_decode_time_seconds_count{LABELS} {decode_count}\n"
        f"vllm:request_decode_time_seconds_sum{LABELS} {decode_sum}\n"
        "# HELP vllm:iteration_tokens_total Tokens per engine step.\n"
        "# TYPE vllm:iteration_tokens_total histogram\n"
        f'vllm:iteration_tokens_total_bucket{{engine="0",le="+Inf",model_name="tiny-llama"}} {steps}\n'
        f"vllm:iteration_tokens_total_count{LABELS} {steps}\n"
        f"vllm:iteration_tokens_total_sum{LABELS} {steps * 2}\n")
    return MetricsPage.parse(text.encode())


def stream(tokens: int, prompt: int = 100) -> TimedStream:
    return TimedStream(tuple(float(i) for i in range(tokens)), tuple(range(1, tokens + 1)), prompt)


def test_two_streams_the_engine_ran_one_after_the_other_are_a_batch_of_one() -> None:
    """Seen on a real CPU engine whose API server shares a core: 24 + 24 tokens in 48 steps.
    Recording that point at c=2 would teach the fit a one-request step as a two-request one."""
    before, after = page(10, 1.0, 500), page(12, 1.0 + 46 * 0.004, 548)
    point = _engine_point(before, after, [stream(24), stream(24)], concurrency=2, context=100)
    assert point is not None
    assert point.running == pytest.approx(1.0)
    assert point.step_s == pytest.approx(0.004)  # decode time over 2 x 23 steps
    assert point.resident_tokens == round(1.0 * (100 + 12))
    assert point.steps == 48


def test_streams_that_overlapped_are_their_measured_batch() -> None:
    before, after = page(0, 0.0, 0), page(4, 4 * 23 * 0.007, 25)
    point = _engine_point(before, after, [stream(24)] * 4, concurrency=4, context=100)
    assert point is not None
    assert point.running == pytest.approx(96 / 25)
    assert point.step_s == pytest.approx(0.007)


def test_a_point_not_all_of_whose_streams_were_recorded_is_not_the_engines_word() -> None:
    before, after = page(0, 0.0, 0), page(1, 0.1, 25)
    assert _engine_point(before, after, [stream(24)] * 2, concurrency=2, context=100) is None


def test_extra_decode_counts_from_released_leases_are_allowed() -> None:
    """A producer records a released one-token KV lease with a decode time of about 0."""
    before, after = page(0, 0.0, 0), page(3, 2 * 23 * 0.005, 25)
    point = _engine_point(before, after, [stream(24)] * 2, concurrency=2, context=100)
    assert point is not None and point.step_s == pytest.approx(0.005)


def test_an_engine_without_the_step_family_falls_back_to_arrivals() -> None:
    text = (b"# TYPE vllm:request_decode_time_seconds histogram\n"
            b'vllm:request_decode_time_seconds_count{engine="0"} 2\n'
            b'vllm:request_decode_time_seconds_sum{engine="0"} 0.2\n')
    assert _engine_point(page(0, 0.0, 0), MetricsPage.parse(text), [stream(24)] * 2, 2, 100) is None


def test_engines_on_one_host_are_grouped_in_fleet_order_hosts_apart() -> None:
    urls = {"a": "http://10.0.0.1:8000", "b": "http://10.0.0.2:8000",
            "c": "http://10.0.0.1:8001", "d": "http://ENG3.lab:8000", "e": "http://eng3.lab:9000"}
    assert by_host(list(urls), urls) == [["a", "c"], ["b"], ["d", "e"]]
