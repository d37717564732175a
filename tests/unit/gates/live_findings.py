"""A test helper: status rows with what a live check found, through the gates' declared live
rules (deploy/gates/registry.py), as `narwhal status` applies them."""

from __future__ import annotations

from typing import Any

from narwhal.deploy.gates.live_check import Live, findings
from narwhal.deploy.gates.registry import SPECS
from narwhal.deploy.ledger.status import GateStatus, with_findings


def with_live_changes(rows: list[GateStatus], doc: dict[str, Any], changes: list[Any],
                      router: str = "", links: list[Any] | None = None,
                      prometheus: str = "") -> list[GateStatus]:
    live = Live(engines=list(changes), router=router, prometheus=prometheus,
                links=list(links or []))
    return with_findings(SPECS, rows, doc, findings(live))
