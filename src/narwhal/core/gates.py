"""The runbook's seven gates, in order, and the inputs that define each.

The "Repeat work when its measured input changes" table of the runbook is computed from
`GATE_INPUTS`: an input that moved makes every gate that declares it stale, and every later
gate that consumed that gate's evidence, unless `VERDICT_ONLY` says the input only judges
the gate's own measurements again (what later gates read from it cannot move).
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

# Which named inputs define which gate. Input names are the keys computed by
# deploy.inputs.fingerprints; a moved input marks these gates (and all later gates) stale.
GATE_INPUTS: dict[str, tuple[str, ...]] = {
    "discover": ("hosts", "engine-image", "model", "launch-policy", "fabric", "ports", "ssh-keys",
                 "credentials"),
    "install": ("revision", "hosts", "launch-policy"),
    # transport: the KV transfer path an engine is started on (UCX_TLS, UCX_NET_DEVICES, its
    # container's RDMA devices) is the one Gate D measures (deploy/gates/transfer.py)
    "engines": ("engine-image", "model", "launch-policy", "ports", "transport"),
    "fabric": ("fabric", "hosts", "transport", "workload"),
    "attest": ("ports",),
    # The workload reaches Gate F only through its profiled range: a prompt length inside what
    # every saved profile measured keeps the profiles and the full preflight (the runbook's
    # first repeat-work row); one beyond is a measured input, judged against the saved
    # profiles by `narwhal status` (deploy/gates/preflight.uncovered), not a digest here.
    # kv-canary: the canary's period, which Gate F writes into the fleet the router serves
    # handoff-budget: the workload's transfer budget, which Gate F writes into the fleet as
    # the handoff's deadline (a moved budget re-judges D's samples and repeats F and G)
    "preflight": ("slo", "kv-canary", "handoff-budget"),
    "serve": ("router", "slo"),
}

# Inputs that, for the gate declaring them, only re-judge what it measured: its later readers
# are not stale because of them. Gate D's budget comes from the workload; a moved workload holds
# each saved sample to the new budget (and measures again only an edge that no longer meets
# it), while the link records Gates E and F read describe links, which a workload cannot move.
VERDICT_ONLY: dict[str, tuple[str, ...]] = {"fabric": ("workload",)}


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
