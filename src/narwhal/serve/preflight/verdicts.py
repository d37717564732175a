"""One verdict per gate and subject: what was measured, against which budget, and why."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["pass", "fail", "skip"]
GATES = ("reach", "model", "profile", "pace", "tokenize", "events", "kv", "contract", "slo")


@dataclass(frozen=True)
class Verdict:
    """A gate's finding about one subject (an engine id, `P->C` for a pair, or `fleet`)."""

    gate: str
    subject: str
    status: Status
    measured: str = ""  # human text of the measured value ("0.41 s", "['tiny']")
    budget: str = ""  # what it was held to ("<= 1.2 s", "== ['tiny']")
    detail: str = ""  # why it failed or skipped, with the fix; or a note on a pass
    values: dict[str, Any] = field(default_factory=dict)  # machine-readable measurements

    def document(self) -> dict[str, Any]:
        return {"gate": self.gate, "subject": self.subject, "status": self.status,
                "measured": self.measured, "budget": self.budget, "detail": self.detail,
                "values": self.values}


def passed(gate: str, subject: str, measured: str, budget: str, detail: str = "",
           **values: Any) -> Verdict:
    return Verdict(gate, subject, "pass", measured, budget, detail, values)


def failed(gate: str, subject: str, measured: str, budget: str, detail: str,
           **values: Any) -> Verdict:
    return Verdict(gate, subject, "fail", measured, budget, detail, values)


def skipped(gate: str, subject: str, reason: str) -> Verdict:
    return Verdict(gate, subject, "skip", detail=reason)


def pair_id(producer: str, consumer: str) -> str:
    return f"{producer}->{consumer}"


def seconds(value: float) -> str:
    return f"{value:.3f} s"
