"""Each gate as a function, `run(ctx, options, progress) -> result`: what its command does,
called the same way by its argparse handler and by `narwhal deploy`.

A run plans, records the plan first and executes on the spine (gates/runner.py); it raises
GateBlocked for a blocked verdict and closes the run's sessions however it ends. The result is
what `--json` shows beside the verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import narwhal
from narwhal.core.errors import InputError, Problem
from narwhal.deploy.actions.context import Context
from narwhal.deploy.actions.output import Progress
from narwhal.deploy.checkpoint import gate_a
from narwhal.deploy.checkpoint import kit as stage_kit
from narwhal.deploy.checkpoint.kit import Kit
from narwhal.deploy.gates import attest, discover, engines, fabric, install, preflight, serve
from narwhal.deploy.gates.registry import SPECS
from narwhal.deploy.gates.runner import run_gate
from narwhal.deploy.hosts.base import Host
from narwhal.deploy.hosts.sessions import Sessions
from narwhal.deploy.ledger.attempt import Attempt
from narwhal.deploy.package.prepared import Prepared

Execute = Callable[[Attempt], dict[str, Any]]
Prepare = Callable[[Sessions], tuple[Any, Execute]]
# the git checkout holding the revision when none is named: this narwhal's own
DEFAULT_CHECKOUT = Path(narwhal.__file__).resolve().parents[2]


def router_alias(sessions: Sessions) -> str:
    """The physical host that holds the router role."""
    return next(alias for alias, roles in sessions.roles().items() if "router" in roles)


def on_host(sessions: Sessions, alias: str, work: Callable[[Host, Attempt], dict[str, Any]]
            ) -> Execute:
    """An execute step that runs on one host, every command of it recorded in the attempt."""
    def execute(attempt: Attempt) -> dict[str, Any]:
        host = sessions.get(alias)
        with attempt.bind(host):
            return work(host, attempt)
    return execute


def on_spine(ctx: Context, gate: str, prepare: Prepare) -> dict[str, Any]:
    """Plan with the run's sessions, then run the gate on the spine; sessions closed after."""
    try:
        sessions = ctx.sessions()
        plan_doc, execute = prepare(sessions)
        return run_gate(SPECS[gate], ctx.ledger, ctx.fingerprints(), sessions.roles(),
                        ctx.inputs.revision, plan_doc, execute)
    finally:
        ctx.close()


@dataclass(frozen=True)
class DiscoverOptions:
    repair_checkpoint: bool = False  # fetch again the staged files that differ from the pin
    wheelhouse: Path | None = None  # the stage kit's wheels; None: built under RUNS/wheelhouse


def run_discover(ctx: Context, options: DiscoverOptions | None, progress: Progress
                 ) -> dict[str, Any]:
    opts = options or DiscoverOptions()

    def kit() -> tuple[Kit, Path]:
        progress("workstation", "building the stage kit (the locked hub client)")
        built = stage_kit.for_checkout(ctx.runs, DEFAULT_CHECKOUT / "runtime.lock",
                                       opts.wheelhouse)
        return built, built.archive(ctx.runs / "builds")

    def prepare(sessions: Sessions) -> tuple[Any, Execute]:
        targets = discover.plan(ctx.inputs)
        staging = gate_a.plan(ctx.inputs, ctx.ledger, ctx.runs / "hub-cache", kit,
                              opts.repair_checkpoint)
        progress.say(f"narwhal discover: inspecting {len(targets)} host(s) at once")
        doc: dict[str, Any] = {"targets": [{"alias": t.alias, "role": t.role,
                                            "request": t.request} for t in targets]}
        if staging is not None:
            doc["checkpoint"] = staging.document()
            progress.say(f"narwhal discover: checkpoint {staging.manifest.repo_id}@"
                         f"{staging.manifest.revision} pinned to commit "
                         f"{staging.manifest.commit}")
        return doc, lambda attempt: discover.execute(ctx.inputs, sessions, attempt, targets,
                                                     progress, staging)
    return on_spine(ctx, "discover", prepare)


@dataclass(frozen=True)
class InstallOptions:
    wheelhouse: Path | None = None  # runtime.lock's wheels; None: built under RUNS/wheelhouse
    checkout: Path | None = None  # None: DEFAULT_CHECKOUT
    prepared: str | None = None  # a run prepared earlier (`--prepare-only`)


def prepared_install(ctx: Context, options: InstallOptions, progress: Progress
                     ) -> Prepared:
    """The run to install: the one prepared earlier, or prepared now."""
    if options.prepared:
        return install.load_prepared(ctx.ledger, options.prepared, ctx.inputs)
    return install.plan(ctx.inputs, ctx.ledger, ctx.runs, options.checkout or DEFAULT_CHECKOUT,
                        options.wheelhouse, progress)


def run_install(ctx: Context, options: InstallOptions, progress: Progress) -> dict[str, Any]:
    def prepare(sessions: Sessions) -> tuple[Any, Execute]:
        prepared = prepared_install(ctx, options, progress)
        progress.say(f"narwhal install: {len(prepared.hosts)} host(s) at once, revision "
                     f"{prepared.revision[:12]}")
        return install.plan_document(prepared), lambda attempt: install.execute(
            sessions, attempt, prepared, progress)
    return on_spine(ctx, "install", prepare)


@dataclass(frozen=True)
class EngineOptions:
    recapture: tuple[str, ...] | None = None  # capture only these running engines again
    restart: tuple[str, ...] | None = None  # start these again from their plan, and capture


def _partial_engines(ctx: Context, sessions: Sessions, options: EngineOptions,
                     progress: Progress) -> tuple[Any, Execute]:
    targets, doc = engines.plan(ctx.inputs, ctx.ledger)
    again, restart = list(options.recapture or []), list(options.restart or [])
    both = sorted(set(again) & set(restart))
    if both:
        raise InputError("--restart", [Problem("--restart", f"{', '.join(both)} also given "
                                               "to --recapture", "name each engine in one of "
                                               "the two")])
    carried = engines.carried_captures(ctx.ledger, targets, again + restart)
    doc["recapture"] = {"engines": again, "restart": restart, "carried": {
        role: art.attempt for role, art in carried.items()}}
    said = [f"capturing {', '.join(again)} again"] if again else []
    said += [f"starting {', '.join(restart)} again"] if restart else []
    progress.say(f"narwhal engines: {'; '.join(said)}; {len(carried)} capture(s) carried")
    return doc, lambda attempt: engines.recapture(sessions, attempt, targets, doc, carried,
                                                  progress, frozenset(restart))


def run_engines(ctx: Context, options: EngineOptions, progress: Progress) -> dict[str, Any]:
    def prepare(sessions: Sessions) -> tuple[Any, Execute]:
        if options.recapture is not None or options.restart is not None:
            return _partial_engines(ctx, sessions, options, progress)
        targets, doc = engines.plan(ctx.inputs, ctx.ledger)
        progress.say(f"narwhal engines: {len(targets)} engine(s) in "
                     f"{len(doc['start_groups'])} start group(s)")
        return doc, lambda attempt: engines.execute(sessions, attempt, targets, doc, progress)
    return on_spine(ctx, "engines", prepare)


def run_fabric(ctx: Context, options: fabric.FabricOptions, progress: Progress
               ) -> dict[str, Any]:
    def prepare(sessions: Sessions) -> tuple[Any, Execute]:
        p = fabric.plan(ctx.inputs, ctx.ledger, options)
        progress.say(f"narwhal fabric: {len(p.edges)} directed edge(s) between "
                     f"{len(p.hosts)} hosts, one at a time")
        return p.document(), lambda attempt: fabric.execute(ctx.inputs, sessions, ctx.ledger,
                                                            attempt, p, progress)
    return on_spine(ctx, "fabric", prepare)


def run_attest(ctx: Context, options: None, progress: Progress) -> dict[str, Any]:
    def prepare(sessions: Sessions) -> tuple[Any, Execute]:
        router = router_alias(sessions)
        p = attest.plan(ctx.inputs, ctx.ledger, router)
        progress.say(f"narwhal attest: {len(p.sidecars)} sidecar(s) at once, checked from "
                     f"{router}")
        return p.document(), lambda attempt: attest.execute(ctx.inputs, sessions, ctx.ledger,
                                                            attempt, p, progress)
    return on_spine(ctx, "attest", prepare)


def run_preflight(ctx: Context, options: None, progress: Progress) -> dict[str, Any]:
    def prepare(sessions: Sessions) -> tuple[Any, Execute]:
        router = router_alias(sessions)
        p = preflight.plan(ctx.inputs, ctx.ledger, router)
        progress.say(f"narwhal preflight: {len(p.fleet['engines'])} engine(s), on {router}")
        return p.document(), on_host(sessions, router, lambda host, attempt: preflight.execute(
            host, attempt, p, progress))
    return on_spine(ctx, "preflight", prepare)


def run_serve(ctx: Context, options: None, progress: Progress) -> dict[str, Any]:
    def prepare(sessions: Sessions) -> tuple[Any, Execute]:
        router = router_alias(sessions)
        p = serve.plan(ctx.inputs, ctx.ledger, router)
        progress.say(f"narwhal serve: the router at {p.router_url} on {router}, "
                     f"{len(p.targets())} scrape targets")
        return p.document(), on_host(sessions, router, lambda host, attempt: serve.execute(
            ctx.inputs, ctx.ledger, host, attempt, p, progress))
    return on_spine(ctx, "serve", prepare)
