"""Emulated engines on lab hosts: KV crosses the fabric, so a shaped edge shows in handoff time."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from narwhal.lab.faults import Faults
from narwhal.lab.hosted_engines import MODEL_NAME, drive, emulators
from narwhal.lab.plan import LabPlan

pytestmark = [pytest.mark.lab, pytest.mark.timeout(300)]
RATE_MBIT = 20
WORDS = (150, 300, 600)


def _handoffs(faults: Faults, prefill: str, decode: str) -> list[dict[str, float]]:
    rows: list[dict[str, float]] = drive(faults.plan, "handoff", prefill, decode, "--model",
                                         MODEL_NAME, "--words", *map(str, WORDS),
                                         "--repeat", "2")["rows"]
    return rows


def _kv_bytes(prompt_tokens: float) -> float:
    """The lab model's KV per token: 4 layers x K,V x 4 kv heads x 32 x bf16 = 2048 B."""
    return prompt_tokens * 2048


def test_handoff_time_grows_with_the_kv_bytes_on_a_shaped_edge(
        faults: Faults, tmp_path: Path) -> None:
    plan = faults.plan
    with emulators(plan, [("eng1", 8000), ("eng2", 8000)], tmp_path) as (p, d):
        drive(plan, "handoff", p.url, d.url, "--model", MODEL_NAME, "--words", "5")  # handshake
        fast = _handoffs(faults, p.url, d.url)
        faults.shape("eng1", "eng2", f"{RATE_MBIT}mbit")
        slow = _handoffs(faults, p.url, d.url)
        reverse = drive(plan, "handoff", d.url, p.url, "--model", MODEL_NAME,
                        "--words", str(WORDS[-1]))["rows"]
    rate_bytes = RATE_MBIT * 1e6 / 8
    per_size = {}
    for words in WORDS:
        rows = [r for r in slow if r["words"] == words]
        seconds = statistics.median(r["decode_s"] for r in rows)
        expected = _kv_bytes(rows[0]["prompt_tokens"]) / rate_bytes
        per_size[words] = (seconds, expected)
        # the pull is paced by the shaped edge: within 35 % of bytes / rate
        assert 0.65 * expected <= seconds <= 1.35 * expected + 0.1, (words, seconds, expected)
    print("handoff s (measured, bytes/rate) at", RATE_MBIT, "mbit:",
          {w: (round(m, 3), round(e, 3)) for w, (m, e) in per_size.items()})
    small, large = per_size[WORDS[0]], per_size[WORDS[-1]]
    # proportional: the time ratio follows the byte ratio
    assert large[0] / small[0] == pytest.approx(large[1] / small[1], rel=0.3)
    unshaped = statistics.median(r["decode_s"] for r in fast if r["words"] == WORDS[-1])
    assert unshaped < per_size[WORDS[-1]][0] / 5
    # the cap is on eng1 -> eng2 only: pulling the other way is not slowed
    assert reverse[0]["decode_s"] < per_size[WORDS[-1]][0] / 5


def test_eight_emulated_engines_fit_in_one_gib(needs_lab: LabPlan, tmp_path: Path) -> None:
    placements = [(host, 8000 + i) for i, host in
                  enumerate(["eng1", "eng2", "eng3"] * 3)][:8]
    with emulators(needs_lab, placements, tmp_path) as engines:
        # one handoff on each engine pair so connectors, leases and buffers are in use
        for p, d in zip(engines[::2], engines[1::2], strict=True):
            drive(needs_lab, "handoff", p.url, d.url, "--model", MODEL_NAME, "--words", "200")
        total = sum(e.rss_bytes() for e in engines)
    print(f"8 emulators: {total / 2**20:.0f} MiB RSS in total")
    assert total < 2**30, f"{total / 2**20:.0f} MiB"
