"""The live KV canary's rules: each probe's verdict, which pairs are held, the reference
document's checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from narwhal.core.errors import InputError
from narwhal.core.kv_canary import load_canary
from narwhal.serve.router.canary import judge as J
from narwhal.serve.router.canary.holds import PairHolds

REF = J.Reference(prompt="p", prompt_tokens=96, max_tokens=2, text=" a b",
                  token_logprobs=(-0.5, -1.25))


def _answer(text: Any = " a b", logprobs: Any = (-0.5, -1.25)) -> dict[str, Any]:
    return {"choices": [{"text": text, "logprobs": None if logprobs is None else
                         {"token_logprobs": list(logprobs)}}]}


def test_the_reference_answer_with_the_whole_prompt_pulled_passes() -> None:
    verdict = J.judge(REF, 200, _answer(), 96.0, 1e-3)
    assert verdict.ok and "96 prompt tokens pulled" in verdict.detail


@pytest.mark.parametrize(("status", "body", "pulled", "kind", "said"), [
    (200, _answer(" a c"), 96.0, J.MISMATCH, "answered ' a c'"),
    (200, _answer(logprobs=(-0.5, -1.3)), 96.0, J.MISMATCH, "token 1's logprob"),
    (200, _answer(logprobs=(-0.5,)), 96.0, J.MISMATCH, "1 logprobs came back"),
    (200, _answer(logprobs=None), 96.0, J.MISMATCH, "no logprobs"),
    (200, _answer(logprobs=(-0.5, float("nan"))), 96.0, J.MISMATCH, "token 1's logprob"),
    (200, _answer(logprobs=(-0.5, "x")), 96.0, J.MISMATCH, "token 1's logprob"),
    (200, {"choices": "junk"}, 96.0, J.MISMATCH, "no completion text"),
    (200, {}, 96.0, J.MISMATCH, "no completion text"),
    (200, _answer(text=7), 96.0, J.MISMATCH, "no completion text"),
    (200, _answer(), 0.0, J.RECOMPUTED, "took 0 of the prompt's 96"),
    (200, _answer(), 64.0, J.RECOMPUTED, "took 64"),
    (200, _answer(), None, J.FAILED, "no external KV counter"),
    (500, {"error": {"message": "boom"}}, None, J.FAILED, "HTTP 500: boom"),
    (404, {"error": "gone"}, None, J.FAILED, "HTTP 404: gone"),
])
def test_every_way_a_probe_can_go_wrong_is_a_named_verdict(
        status: int, body: dict[str, Any], pulled: float | None, kind: str, said: str) -> None:
    verdict = J.judge(REF, status, body, pulled, 1e-3)
    assert (verdict.kind, verdict.ok) == (kind, False)
    assert said in verdict.detail


def test_logprobs_within_the_tolerance_pass_and_a_reference_without_them_asks_none() -> None:
    assert J.judge(REF, 200, _answer(logprobs=(-0.5004, -1.2496)), 96.0, 1e-3).ok
    plain = J.Reference("p", 96, 2, " a b", None)
    assert J.judge(plain, 200, _answer(logprobs=None), 96.0, 1e-3).ok


def test_the_external_counter_is_summed_over_label_sets_and_junk_reads_as_none() -> None:
    page = (b'# HELP x\nvllm:prompt_tokens_by_source_total{engine="0",source="external_kv_transfer"}'
            b' 96.0\nvllm:prompt_tokens_by_source_total{engine="1",source="external_kv_transfer"}'
            b' 4.0\nvllm:prompt_tokens_by_source_total{engine="0",source="local_compute"} 7.0\n')
    assert J.external_kv_tokens(page) == 100.0
    assert J.external_kv_tokens(b"vllm:other 1\n") is None
    bad = b'vllm:prompt_tokens_by_source_total{source="external_kv_transfer"} NaNx\n'
    assert J.external_kv_tokens(bad) is None


def test_a_pair_is_held_from_its_first_bad_probe_until_it_passes_enough_times() -> None:
    holds = PairHolds(release_after=2)
    good, bad = J.Verdict(J.OK, "fine"), J.Verdict(J.MISMATCH, "wrong tokens")
    holds.record("p0", "d0", good)
    assert not holds.held("p0", "d0")
    holds.record("p0", "d0", bad)
    assert holds.held("p0", "d0") and not holds.held("d0", "p0")  # ordered: one direction
    holds.record("p0", "d0", good)
    assert holds.held("p0", "d0")  # one pass is not enough
    holds.record("p0", "d0", bad)
    holds.record("p0", "d0", good)
    assert holds.held("p0", "d0")  # the count starts again after a failure
    holds.record("p0", "d0", good)
    assert not holds.held("p0", "d0")
    state = holds.state()["p0->d0"]
    assert (state["verdict"], state["probes"], state["held"]) == ("ok", 6, False)


def _reference(tmp_path: Path, **changes: Any) -> Path:
    doc = {"schema": "narwhal.kv-canary", "schema_version": 1, "model": "m", "prompt": "p q",
           "prompt_tokens": 96, "max_tokens": 8, "text": " a", "token_logprobs": [-0.5],
           "pairs": [{"producer": "p0", "consumer": "d0", "first_token_s": 0.1}],
           "measured_at": "2026-12-06T00:00:00+00:00", **changes}
    path = tmp_path / "kv-canary.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_reference_reads_back_as_written(tmp_path: Path) -> None:
    ref = load_canary(_reference(tmp_path))
    assert (ref.model, ref.prompt_tokens, ref.text, ref.token_logprobs) == ("m", 96, " a", (-0.5,))


@pytest.mark.parametrize("changes", [
    {"schema_version": 2}, {"prompt": ""}, {"prompt_tokens": 0}, {"max_tokens": 5000},
    {"pairs": []}, {"measured_at": "2026-12-06T00:00:00"}, {"extra": 1},
    {"token_logprobs": ["x"]}, {"prompt_tokens": True}, {"text": None},
    {"prompt": "x" * 1_000_001},
])
def test_a_reference_that_is_not_one_is_refused_naming_the_file(
        tmp_path: Path, changes: dict[str, Any]) -> None:
    path = _reference(tmp_path, **changes)
    with pytest.raises(InputError) as err:
        load_canary(path)
    assert str(path) in str(err.value)
