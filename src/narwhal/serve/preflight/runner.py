"""Run the gates in cost order; each reads and records engine failures in the shared state."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from narwhal.serve.preflight import basic, contract, events_gate, kv_gate, pace, profile_gate
from narwhal.serve.preflight.state import CheckState
from narwhal.serve.preflight.verdicts import Verdict

Gate = Callable[[CheckState], Awaitable[list[Verdict]]]

# Cheapest first: a fleet that cannot be reached is not worth a KV handoff.
ORDER: tuple[tuple[str, Gate], ...] = (
    ("reach", basic.reach),
    ("model", basic.model),
    ("profile", profile_gate.profile),
    ("pace", pace.pace),
    ("tokenize", basic.tokenize),
    ("events", events_gate.events),
    ("kv", kv_gate.kv),
    ("contract", contract.contract),
    ("slo", profile_gate.slo),
)


async def run_gates(state: CheckState, only: tuple[str, ...] | None = None,
                    progress: Callable[[str], None] | None = None) -> list[Verdict]:
    """Every gate's verdicts in order (`only`: the named gates, in the same order)."""
    out: list[Verdict] = []
    for name, gate in ORDER:
        if only is not None and name not in only:
            continue
        if progress is not None:
            progress(name)
        out.extend(await gate(state))
    return out
