"""The runbook's seven gates, in order: their letters, names, commands and titles.

What defines each gate and what makes its pass stale is declared in deploy/gates/registry.py.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gate:
    letter: str
    name: str
    command: str
    title: str


GATES: tuple[Gate, ...] = (
    Gate("A", "discover", "discover", "Freeze inputs and discover the real deployment"),
    Gate("B", "install", "install", "Package and install the approved revision"),
    Gate("C", "engines", "engines", "Validate and start every engine, capture live KV cache"),
    Gate("D", "fabric", "fabric", "Prove the transfer fabric against the serving cache"),
    Gate("E", "attest", "attest", "Attest the live engine processes"),
    Gate("F", "preflight", "preflight", "Profile once and run the live KV contract"),
    Gate("G", "serve", "serve", "Start the service and validate capacity through the private path"),
)

GATE_NAMES: tuple[str, ...] = tuple(g.name for g in GATES)

# Activities that are recorded like gates but are not part of the ordered sequence.
# `trust` is `narwhal hosts trust`: which key each host alias was pinned to, and replaced.
ACTIVITIES: tuple[str, ...] = ("access", "trust", "shell", "status", "load-trial")

def gate(name_or_letter: str) -> Gate:
    """Look a gate up by name ('fabric') or letter ('D')."""
    for g in GATES:
        if name_or_letter in (g.name, g.letter, g.letter.lower()):
            return g
    known = ", ".join(f"{g.letter}={g.name}" for g in GATES)
    raise KeyError(f"unknown gate {name_or_letter!r}; known gates: {known}")


def downstream(name: str) -> tuple[str, ...]:
    """The gate and every gate after it."""
    idx = GATE_NAMES.index(name)
    return GATE_NAMES[idx:]
