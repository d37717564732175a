"""Phase-1 placement is least-outstanding over admitted engines; the journal never blocks."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from narwhal.serve.router.observe.journal import Journal
from narwhal.serve.router.observe.metrics import RouterMetrics, slo_buckets
from narwhal.serve.router.request.upstream import EnginePool
from narwhal.serve.router.scheduling.choosers import LeastOutstanding
from narwhal.serve.router.scheduling.engines import Engine, Placement
from narwhal.serve.router.settings import EngineSpec


@dataclass
class Facts:
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    tenant: str | None = None
    ttft_error_s: float | None = None
    tpot_error_s: float | None = None
    placement: Placement | None = None
    cached: dict[str, int] | None = None


def _engine(name: str, role: str) -> Engine:
    spec = EngineSpec(name, f"http://h:{len(name)}", "h", 1, role, role != "decode",
                      role != "prefill", b"h:1")
    return Engine(spec, EnginePool("h", 1, connect_timeout_s=1, keepalive_s=1))


def test_each_leg_goes_to_the_least_loaded_admitted_engine_of_its_pool() -> None:
    p0, p1, d0, d1 = (_engine("p0", "prefill"), _engine("p1", "prefill"),
                      _engine("d0", "decode"), _engine("d1", "decode"))
    chooser = LeastOutstanding([p0, p1, d0, d1])
    p0.outstanding, d1.outstanding = 3, 2
    placement = chooser.place(Facts())
    assert placement is not None
    assert (placement.prefill, placement.decode) == (p1, d0)
    d0.ejected = True
    placement = chooser.place(Facts())
    assert placement is not None and placement.decode is d1
    d1.ejected = True
    assert chooser.place(Facts()) is None


def test_equal_engines_share_load_by_turns() -> None:
    engines = [_engine("p0", "prefill"), _engine("p1", "prefill"), _engine("d0", "decode")]
    chooser = LeastOutstanding(engines)
    picks = set()
    for _ in range(4):
        placement = chooser.place(Facts())
        assert placement is not None
        picks.add(placement.prefill.id)
    assert picks == {"p0", "p1"}


def test_a_tie_on_engines_that_do_both_keeps_the_request_on_one_engine() -> None:
    b0, b1 = _engine("b0", "both"), _engine("b1", "both")
    chooser = LeastOutstanding([b0, b1])
    placement = chooser.place(Facts())
    assert placement is not None and placement.single
    b0.outstanding, b1.outstanding = 0, 3  # prefill picks b0; b0 is also the least-loaded decoder
    again = chooser.place(Facts())
    assert again is not None and (again.prefill, again.decode) == (b0, b0)


def test_a_retry_never_returns_an_engine_already_tried() -> None:
    d0, d1 = _engine("d0", "decode"), _engine("d1", "decode")
    chooser = LeastOutstanding([_engine("p0", "prefill"), d0, d1])
    assert chooser.another_decode(Facts(), [d0]) is d1
    assert chooser.another_decode(Facts(), [d0, d1]) is None


def test_the_journal_writes_every_row_and_counts_rows_it_had_to_drop(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "sub" / "journal.jsonl", max_rows=16, flush_interval_s=0.01)
    for k in range(40):  # the writer is not started: the bound is hit
        journal.record({"request_id": f"r{k}"})
    assert (journal.accepted, journal.dropped) == (16, 24)
    journal.open()
    journal.close()
    lines = (tmp_path / "sub" / "journal.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["request_id"] for r in rows] == [f"r{k}" for k in range(16)]
    assert rows[0]["schema"] == "narwhal.journal" and rows[0]["schema_version"] == 1
    assert (tmp_path / "sub" / "journal.jsonl").stat().st_mode & 0o777 == 0o600


def test_histogram_buckets_are_fractions_of_the_slo() -> None:
    buckets = slo_buckets(2.0)
    assert 2.0 in buckets and 1.0 in buckets and buckets == tuple(sorted(buckets))
    metrics = RouterMetrics(ttft_s=2.0, tpot_s=0.1)
    metrics.ttft.observe(1.0)
    metrics.ttft.observe(3.0)
    family = metrics.ttft.family()
    counts = {s.labels.get("le"): s.value for s in family.samples if s.name.endswith("_bucket")}
    assert counts["1.0"] == 1 and counts["2.0"] == 1 and counts["+Inf"] == 2
