"""One rate's summary and its verdict, in the order a miss must be explained.

A rate says "capacity" only when nothing else explains a miss. First the record itself: a
client that hit its stated connection budget ("client-limited": requests waited for a
connection, so the offered load was not sent; client.py), a client that could not keep its
schedule otherwise or used nearly all of its one CPU doing so ("client
saturated": its timings are its own, not the fleet's), a journal that does not
reconcile with what was sent ("records do not reconcile"), a Prometheus that stopped answering
("scrape failure"), requests the router refused as invalid (a 4xx other than 429: the
trial's requests were wrong). Only then SLO attainment: "within SLO" or "capacity miss" (429,
the router's admission refusal near capacity, counts as a miss).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from narwhal.core.attainment import TARGET_ATTAINMENT

MAX_LAG_S = 0.1  # a send later than this after its planned time means the client lagged
MAX_LATE_SHARE = 0.05  # more late sends than this share: the schedule was not kept
MAX_CLIENT_CPU = 0.9  # the client is one event loop: past this share of a core it is the limit


@dataclass(frozen=True)
class Record:
    """One request as the client saw it."""

    request_id: str
    planned_s: float
    sent_s: float
    status: int
    ttft_s: float | None
    token_times_s: tuple[float, ...]
    bytes: int
    error: str = ""
    client_limited: bool = False  # waited for the client's connection budget before sending

    @property
    def lag_s(self) -> float:
        return self.sent_s - self.planned_s

    @property
    def tpot_s(self) -> float | None:
        t = self.token_times_s
        return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None

    def attains(self, ttft_s: float, tpot_s: float) -> bool:
        tpot = self.tpot_s
        return (self.status == 200 and not self.error and self.ttft_s is not None
                and self.ttft_s <= ttft_s and (tpot is None or tpot <= tpot_s))

    def as_dict(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "planned_s": round(self.planned_s, 6),
                "sent_s": round(self.sent_s, 6), "status": self.status,
                "ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "tokens": len(self.token_times_s),
                "bytes": self.bytes, "error": self.error or None,
                "client_limited": self.client_limited}


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 6)


def summarise(rate: float, records: list[Record], seconds: float, ttft_s: float,
              tpot_s: float) -> dict[str, Any]:
    ttfts = [r.ttft_s for r in records if r.ttft_s is not None]
    tpots = [t for r in records if (t := r.tpot_s) is not None]
    good = sum(r.attains(ttft_s, tpot_s) for r in records)
    # a wait for the budget is counted apart: lateness is what the client could not explain
    late = sum(r.lag_s > MAX_LAG_S and not r.client_limited for r in records)
    return {
        "rate": rate, "requests": len(records), "seconds": round(seconds, 3),
        "ok": sum(r.status == 200 and not r.error for r in records),
        "attained": good, "attainment": round(good / len(records), 4) if records else 0.0,
        "goodput_per_s": round(good / seconds, 4) if seconds > 0 else 0.0,
        "ttft_p50_s": _pct(ttfts, 0.5), "ttft_p99_s": _pct(ttfts, 0.99),
        "tpot_p50_s": _pct(tpots, 0.5), "tpot_p99_s": _pct(tpots, 0.99),
        "late_sends": late, "client_limited": sum(r.client_limited for r in records),
        "lag_p99_s": _pct([r.lag_s for r in records], 0.99),
        "statuses": {str(s): sum(r.status == s for r in records)
                     for s in sorted({r.status for r in records})},
    }


def verdict(summary: dict[str, Any], reconciled_ok: bool, scrape_ok: bool) -> str:
    if summary.get("client_limited"):
        return "client-limited"  # the budget held sends back: this rate was not offered
    if summary["requests"] and summary["late_sends"] / summary["requests"] > MAX_LATE_SHARE:
        return "client saturated"
    if float(summary.get("client_cpu_share") or 0.0) > MAX_CLIENT_CPU:
        return "client saturated"
    if not reconciled_ok:
        return "records do not reconcile"
    if any(400 <= int(code) < 500 and int(code) != 429 for code in summary["statuses"]):
        return "requests refused as invalid"  # the trial's requests, not the fleet's capacity
    if not scrape_ok:
        return "scrape failure"
    return "within SLO" if summary["attainment"] >= TARGET_ATTAINMENT else "capacity miss"
