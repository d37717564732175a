"""The trial report as a person opens it: rendered offline in headless Chromium, every picture
loaded, the verdict readable, and text from the record shown as text, never as markup."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from narwhal.deploy.trial import report
from tests.browser import CHROMIUM, render

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")

SLO = {"ttft_s": 0.5, "tpot_s": 0.05}
HOSTILE = '<img src="http://203.0.113.9/x.png" onerror="document.title=1">'


def _rate(rate: float, verdict: str, engine: str = "engine-1") -> report.RateData:
    records = [{"request_id": f"t-{n}", "ttft_s": 0.05 + n / 400, "tpot_s": 0.01 + n / 4000}
               for n in range(40)]
    journal = [{"request_id": f"t-{n}", "received_at": 1000.0 + n / rate, "total_s": 0.3,
                "prefill_engine": engine, "decode_engine": "engine-2"} for n in range(40)]
    summary = {"rate": rate, "verdict": verdict, "attainment": 0.95, "goodput_per_s": rate * .95,
               "ttft_p50_s": 0.1, "ttft_p99_s": 0.15, "tpot_p50_s": 0.015, "tpot_p99_s": 0.02,
               "late_sends": 0, "client_cpu_share": 0.1, "reconciled": {"ok": True}}
    return report.RateData(summary, records, journal)


def _write(folder: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder / report.REPORT


def test_the_report_renders_offline_with_every_picture_and_the_verdict(tmp_path: Path) -> None:
    now = time.time()
    spans = [report.AttemptSpan("discover", "001", now - 300, 20, "passed"),
             report.AttemptSpan("fabric", "001", now - 250, 40, "blocked"),
             report.AttemptSpan("fabric", "002", now - 200, 30, "passed")]
    files = report.build("Capacity trial 001", SLO, [_rate(2, "within SLO"),
                                                      _rate(4, "capacity miss")],
                         None, spans, 0.9, now)
    shown = render(_write(tmp_path, files), "#verdict")
    assert "2/s within SLO" in shown.text and "4/s capacity miss" in shown.text
    assert len(shown.images) == 4  # attainment, latency, engine load, timeline
    assert all(i["complete"] and i["width"] > 300 and i["height"] > 150 for i in shown.images)
    assert len(shown.screenshot_png) > 20_000  # pictures drawn, not a blank page
    whole = render(tmp_path / report.REPORT).text
    assert "no passed Gate D attempt in the record" in whole  # a missing picture said in words


def test_a_picture_that_did_not_load_is_seen(tmp_path: Path) -> None:
    files = report.build("t", SLO, [_rate(2, "within SLO")], None, [], 0.9, time.time())
    path = _write(tmp_path, files)
    (tmp_path / "report-latency.png").unlink()
    broken = [i for i in render(path).images if not i["width"]]
    assert [i["src"] for i in broken] == ["report-latency.png"]


def test_text_from_the_record_is_shown_as_text(tmp_path: Path) -> None:
    files = report.build(HOSTILE, SLO, [_rate(2, HOSTILE, engine=HOSTILE)], None, [], 0.9,
                         time.time())
    shown = render(_write(tmp_path, files), "#verdict")
    assert HOSTILE in shown.text  # the verdict string as written, not interpreted
    assert shown.title == HOSTILE  # onerror never ran
    assert all(not i["src"].startswith("http") for i in shown.images)
