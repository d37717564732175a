"""Run one gate on the spine: fingerprint (inputs + what it reads), attempt, plan, execute.

The fingerprint is the gate's `.env` inputs plus the digest of every upstream artifact it reads,
so `narwhal status` can say which measured input moved. The plan is written to the attempt
(plan.json) before `execute` runs, which is before any host changes state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from narwhal.deploy.gates.handoff import read_digests
from narwhal.deploy.gates.spec import GateSpec
from narwhal.deploy.ledger import Ledger
from narwhal.deploy.ledger.attempt import Attempt

T = TypeVar("T")


def fingerprint(spec: GateSpec, ledger: Ledger,
                env_fingerprints: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """What defines this gate now: its `.env` inputs and the artifacts it reads."""
    return {**env_fingerprints.get(spec.name, {}), **read_digests(ledger, spec.reads)}


def run_gate(spec: GateSpec, ledger: Ledger, env_fingerprints: Mapping[str, Mapping[str, str]],
             hosts: dict[str, list[str]], revision: str, plan: Any,
             execute: Callable[[Attempt], T]) -> T:
    """Open the gate's attempt, record `plan` (JSON-able) first, then `execute` in it."""
    with ledger.attempt(spec.name, fingerprint=fingerprint(spec, ledger, env_fingerprints),
                        hosts=hosts, deployment_revision=revision) as attempt:
        attempt.add_json("plan.json", plan)
        return execute(attempt)


def current_fingerprints(specs: Mapping[str, GateSpec], ledger: Ledger,
                         env_fingerprints: Mapping[str, Mapping[str, str]]
                         ) -> dict[str, dict[str, str]]:
    """Every gate's fingerprint now, for `narwhal status` (built gates add what they read)."""
    out = {name: dict(fp) for name, fp in env_fingerprints.items()}
    for name, spec in specs.items():
        out[name] = fingerprint(spec, ledger, env_fingerprints)
    return out
