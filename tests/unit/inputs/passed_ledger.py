"""A ledger document in which every gate passed, and the fingerprints it passed with: the
ground a staleness test moves one input on."""

from __future__ import annotations

from typing import Any

from narwhal.core.gates import GATE_NAMES
from narwhal.deploy.gates.registry import SPECS


def all_passed() -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    prints = {g: {name: f"{name}-1" for name in SPECS[g].inputs} for g in GATE_NAMES}
    doc = {"gates": {g: {"state": "passed", "fingerprint": dict(prints[g]), "attempts": ["a1"]}
                     for g in GATE_NAMES}}
    return doc, prints
