"""The router's journal against what the client sent: every sent id exactly once, no id the
client did not send. Only ids with the trial's tag are the trial's; other traffic is not."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Reconciled:
    sent: int
    journalled: int
    missing: tuple[str, ...]  # sent, not in the journal
    repeated: tuple[str, ...]  # in the journal more than once
    unsent: tuple[str, ...]  # in the journal with the trial's tag, never sent
    unreadable_rows: int

    @property
    def ok(self) -> bool:
        return not (self.missing or self.repeated or self.unsent)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "sent": self.sent, "journalled": self.journalled,
                "missing": list(self.missing[:20]), "repeated": list(self.repeated[:20]),
                "unsent": list(self.unsent[:20]), "unreadable_rows": self.unreadable_rows}


def journal_rows(text: str, tag: str) -> tuple[list[dict[str, Any]], int]:
    """The journal's rows whose request id carries the tag, and how many lines did not parse."""
    rows, bad = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(row, dict) and str(row.get("request_id", "")).startswith(f"{tag}-"):
            rows.append(row)
    return rows, bad


def reconcile_rows(sent_ids: list[str], rows: list[dict[str, Any]],
                   unreadable: int) -> Reconciled:
    """What was sent against the journal rows of the trial (journal_rows, parsed once)."""
    seen = Counter(str(r["request_id"]) for r in rows)
    sent = set(sent_ids)
    return Reconciled(len(sent_ids), len(rows),
                      tuple(sorted(sent - set(seen))),
                      tuple(sorted(i for i, n in seen.items() if n > 1)),
                      tuple(sorted(set(seen) - sent)), unreadable)


def reconcile(sent_ids: list[str], journal_text: str, tag: str) -> Reconciled:
    return reconcile_rows(sent_ids, *journal_rows(journal_text, tag))


def _tokens(value: Any) -> int:
    """A journal count as an int; anything else (absent, null, a string) counts as 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def cache_totals(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the router's cache-aware placement did over the rate, from its journal rows: how
    many requests it priced with the cache, the prompt tokens it predicted the chosen engine
    held, what the engines reported, and how the requests ran. None when no row has it (cache
    awareness off)."""
    cached = [r["cache"] for r in rows if isinstance(r.get("cache"), dict)]
    if not cached:
        return None
    decisions = Counter(str(c.get("decision")) for c in cached)
    return {"requests": len(cached),
            "predicted_hit_tokens": sum(_tokens(c.get("predicted_hit")) for c in cached),
            "observed_hit_tokens": sum(_tokens(c.get("observed_hit")) for c in cached),
            "decisions": dict(sorted(decisions.items()))}


def continuation_totals(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Streams the router continued on another engine after theirs broke mid-answer, from the
    rate's journal rows: how many requests, how many continuations, which engines they left
    and how the requests ended. None when no row was continued."""
    continued = [r for r in rows if isinstance(r.get("continued"), list) and r["continued"]]
    if not continued:
        return None
    steps = [s for r in continued for s in r["continued"] if isinstance(s, dict)]
    left = Counter(str(s.get("from")) for s in steps)
    outcomes = Counter(str(r.get("outcome")) for r in continued)
    return {"requests": len(continued), "continuations": len(steps),
            "from_engines": dict(sorted(left.items())),
            "outcomes": dict(sorted(outcomes.items()))}
