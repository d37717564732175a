"""The seven gates' declarations, in the runbook's order: the one home of every staleness rule.

Each row says what defines the gate (its `.env` inputs and the artifacts it reads), what else
makes its pass stale (measured inputs, live findings), what its pass settles, and how it
redoes part of its work. `narwhal status` and `narwhal deploy` read these rows and nothing
else (deploy/ledger/status.py); a new rule is a new entry here.

The runbook's five repeat-work rows, as they appear below:
- "profiled workload range": preflight's measured input `profile-range`;
- "router restart with the same fleet document": serve's live kinds `router-down`,
  `prometheus-down`;
- "engine restart with the same launch plan": engines' `engine-restarted` / `engine-down`
  (redone for the named engines only) and attest's `engine-unattested`;
- "fabric route, host assignment, or transport": fabric's `link-moved` (and preflight's, to
  exercise the live KV paths again), and the `transport` input of engines and fabric;
- "SLO or workload": the `slo` input of preflight and serve, fabric's verdict-only `workload`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from narwhal.deploy.gates import attest, engines, fabric, install, preflight, serve
from narwhal.deploy.gates.spec import GateSpec, LiveRule, Measured, Partial, sequence
from narwhal.deploy.inputs.fingerprints import gate_fingerprints
from narwhal.deploy.inputs.model import Inputs
from narwhal.deploy.ledger import Ledger


def _preflight_passed(ledger: Ledger) -> bool:
    return bool(ledger.load().get("gates", {}).get("preflight", {}).get("state") == "passed")


def profile_range(inputs: Inputs, ledger: Ledger) -> str:
    """The workload's prompt length held to the range Gate F's saved profiles measured:
    beyond it, the rows that fall short are profiled again."""
    if not _preflight_passed(ledger):
        return ""
    return preflight.range_gap(ledger, inputs.workload.prompt_tokens)


def workload_rejudged(inputs: Inputs, ledger: Ledger) -> str:
    """What a moved workload means for Gate D's samples (the edges measured again, if any),
    and that Gate F is kept while every saved profile covers the new prompt length."""
    note = fabric.rejudged(inputs, ledger)
    if _preflight_passed(ledger) and not profile_range(inputs, ledger):
        note += (f"; every saved profile measured {inputs.workload.prompt_tokens}-token "
                 "prompts: Gate F kept")
    return note.lstrip("; ")


ENGINE_RESTARTED = LiveRule("engine-restarted", "restarted since captured: ")
ENGINE_DOWN = LiveRule("engine-down", "not running, to start again: ")
ENGINE_UNATTESTED = LiveRule("engine-unattested", "not attested now: ", "{subject}: {detail}",
                             "; ")
LINK_MOVED = LiveRule("link-moved", "link moved since measured: ", "{subject} ({detail})", "; ")
ROUTER_DOWN = LiveRule("router-down", "router not serving: ", "{detail}")
PROMETHEUS_DOWN = LiveRule("prometheus-down", "prometheus not serving: ", "{detail}",
                           suffix="; `narwhal serve` (or `narwhal deploy`) starts it again")

SPECS: dict[str, GateSpec] = sequence(
    GateSpec("discover",
             inputs=("hosts", "engine-image", "model", "checkpoint", "launch-policy", "fabric",
                     "ports", "ssh-keys", "credentials")),
    GateSpec("install", inputs=("revision", "hosts", "launch-policy"), reads=install.READS),
    # transport: the KV transfer path an engine is started on (UCX_TLS, UCX_NET_DEVICES, its
    # container's RDMA devices) is the one Gate D measures (deploy/gates/transfer.py)
    GateSpec("engines", inputs=("engine-image", "model", "launch-policy", "ports", "transport"),
             reads=engines.READS, live=(ENGINE_RESTARTED, ENGINE_DOWN),
             clears=("engine-restarted", "engine-down"),
             partial=Partial((("engine-restarted", "recapture"), ("engine-down", "restart")),
                             plan_key="recapture")),
    # Gate D's budget comes from the workload: a moved workload holds each saved sample to the
    # new budget (and measures again only an edge that no longer meets it), while the link
    # records Gates E and F read describe links, which a workload cannot move.
    GateSpec("fabric", inputs=("fabric", "hosts", "transport", "workload"),
             verdict_only=("workload",), reads=fabric.READS, live=(LINK_MOVED,),
             explain={"workload": workload_rejudged}),
    GateSpec("attest", inputs=("ports",), reads=attest.READS, live=(ENGINE_UNATTESTED,),
             clears=("engine-unattested",)),
    # The workload reaches Gate F only through its profiled range (a measured input, not a
    # digest). kv-canary: the canary's period, which Gate F writes into the fleet the router
    # serves; handoff-budget: the workload's transfer budget, which Gate F writes into the
    # fleet as the handoff's deadline (a moved budget re-judges D's samples and repeats F, G).
    GateSpec("preflight", inputs=("slo", "kv-canary", "handoff-budget"), reads=preflight.READS,
             measured=(Measured("profile-range", profile_range),),
             live=(LiveRule("link-moved", "the live KV paths over the moved links are to be "
                            "exercised", "", ""),),
             clears=("link-moved",)),
    GateSpec("serve", inputs=("router", "slo"), reads=serve.READS,
             live=(ROUTER_DOWN, PROMETHEUS_DOWN), clears=("router-down", "prometheus-down")),
)


def env_fingerprints(inputs: Inputs, specs: Mapping[str, GateSpec] | None = None
                     ) -> dict[str, dict[str, str]]:
    """Gate -> the digest of each `.env` input it declares, now."""
    return gate_fingerprints(inputs, {name: spec.inputs
                                      for name, spec in (specs or SPECS).items()})


@dataclass(frozen=True)
class RepeatRow:
    """One row of the runbook's "Repeat work when its measured input changes" table: the
    declarations above that carry it (gate -> the inputs, measured inputs or live kinds), and
    the drill that proves it on the lab."""

    change: str
    declared: tuple[tuple[str, str], ...]
    drill: str  # tests/<file>::<test>


REPEAT_WORK: tuple[RepeatRow, ...] = (
    RepeatRow("Offered rate or request count within the profiled workload range",
              (("fabric", "workload"), ("preflight", "profile-range")),
              "tests/lab/test_preflight_lab.py::"
              "test_a_moved_workload_inside_the_profiled_range_re_judges_the_fabric_alone"),
    RepeatRow("SLO or first-token deadline", (("preflight", "slo"), ("serve", "slo")),
              "tests/lab/test_preflight_lab.py::"
              "test_an_edited_slo_makes_deploy_rerun_preflight_and_serve_only"),
    RepeatRow("Router restart with the same fleet document", (("serve", "router-down"),),
              "tests/lab/test_preflight_lab.py::"
              "test_a_killed_router_is_started_again_alone_bound_to_the_live_generations"),
    RepeatRow("Engine restart with the same launch plan",
              (("engines", "engine-restarted"), ("engines", "engine-down"),
               ("attest", "engine-unattested")),
              "tests/lab/test_preflight_lab.py::"
              "test_a_restarted_engine_makes_deploy_redo_exactly_that_engines_work"),
    RepeatRow("Fabric route, host assignment, or transport",
              (("fabric", "link-moved"), ("preflight", "link-moved"), ("engines", "transport"),
               ("fabric", "transport")),
              "tests/lab/test_fabric_lab.py::"
              "test_an_mtu_changed_on_one_end_resamples_exactly_that_hosts_edges"),
)


def declares(spec: GateSpec, name: str) -> bool:
    """Whether `spec` declares `name` as an input, a measured input or a live kind."""
    return name in spec.inputs or name in {m.name for m in spec.measured} \
        or name in {rule.kind for rule in spec.live}
