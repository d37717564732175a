"""The events gate's rule, as data: silent endpoints and disagreeing predictions fail, named."""

from __future__ import annotations

from narwhal.serve.preflight.events_gate import Observed, judge

END = "tcp://10.0.0.5:5557"


def test_no_publisher_names_the_engine_the_flag_and_the_fix() -> None:
    v = judge("engine-2", Observed(END, connected=False), 5.0)
    assert v.status == "fail" and v.subject == "engine-2" and v.gate == "events"
    assert "--kv-events-config" in v.detail and END in v.detail
    assert "NARWHAL_KV_EVENTS_PORT" in v.detail


def test_a_publisher_that_sends_nothing_for_the_prompt_fails_pointing_at_prefix_caching() -> None:
    v = judge("engine-1", Observed(END, True, 16, 49, batches=0), 5.0)
    assert v.status == "fail" and "--no-enable-prefix-caching" in v.detail


def test_blocks_stored_short_of_the_prompt_fail() -> None:
    v = judge("engine-1", Observed(END, True, 16, 49, batches=1, stored_tokens=16), 5.0)
    assert v.status == "fail" and "16 of 48 tokens" in v.measured


def test_a_prediction_within_one_block_of_the_engine_s_count_passes() -> None:
    ok = Observed(END, True, 16, 49, batches=2, stored_tokens=48, predicted=48, reported=32)
    assert judge("engine-1", ok, 5.0).status == "pass"
    off = Observed(END, True, 16, 49, batches=2, stored_tokens=48, predicted=48, reported=16)
    v = judge("engine-1", off, 5.0)
    assert v.status == "fail" and v.values["predicted"] == 48 and v.values["reported"] == 16
