"""The gates as commands: how each runs, what it shows, and what `narwhal deploy` passes it.

`narwhal deploy` reads this table and the gates' specs only: a gate's deploy options are built
here from deploy's own flags, the subjects a partial re-run names (deploy/gates/spec.Partial),
and the gate's record; each also gives the command line an operator would type for it, which
deploy prints and records in its summary.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from narwhal.deploy.actions import gate_runs, gate_tables
from narwhal.deploy.actions.context import Context
from narwhal.deploy.actions.gate_runs import DiscoverOptions, EngineOptions, InstallOptions
from narwhal.deploy.actions.output import Progress
from narwhal.deploy.gates.fabric import FabricOptions
from narwhal.deploy.gates.handoff import attempt_plan, last_passed_attempt

Options = TypeVar("Options")


@dataclass(frozen=True)
class DeployFlags:
    """`narwhal deploy`'s flags that reach a gate."""

    prepared: str | None = None
    wheelhouse: Path | None = None
    checkout: Path | None = None
    fabric_seconds: int | None = None
    repair_checkpoint: bool = False
    fabric_omit: int | None = None


# subjects of a partial re-run, by option name ({} for the whole gate)
Subjects = Mapping[str, Sequence[str]]
# deploy's options for a gate, and the command line that means the same
DeployOptions = Callable[[Context, DeployFlags, Subjects], tuple[Any, list[str]]]


@dataclass(frozen=True)
class GateCommand(Generic[Options]):
    name: str
    run: Callable[[Context, Options, Progress], dict[str, Any]]
    table: Callable[[dict[str, Any]], None]
    deploy_options: DeployOptions
    shown: Callable[[dict[str, Any]], dict[str, Any]] = dict
    blocked_after: str = ""  # said after a blocked verdict's problem count


def plain(command: str) -> DeployOptions:
    """A gate that takes no options."""
    return lambda ctx, flags, subjects: (None, [command])


def install_options(ctx: Context, flags: DeployFlags, subjects: Subjects
                    ) -> tuple[InstallOptions, list[str]]:
    """A prepared run carries its checkout, so --checkout goes only with a run built now."""
    checkout = None if flags.prepared else flags.checkout
    argv = ["install"]
    for flag, value in (("--prepared", flags.prepared), ("--wheelhouse", flags.wheelhouse),
                        ("--checkout", checkout)):
        argv += [flag, str(value)] if value is not None else []
    return InstallOptions(flags.wheelhouse, checkout, flags.prepared), argv


def discover_options(ctx: Context, flags: DeployFlags, subjects: Subjects
                     ) -> tuple[DiscoverOptions, list[str]]:
    """Gate A takes deploy's repair consent, and the wheelhouse its stage kit shares with
    Gate B."""
    argv = ["discover"] + (["--repair-checkpoint"] if flags.repair_checkpoint else [])
    argv += ["--wheelhouse", str(flags.wheelhouse)] if flags.wheelhouse is not None else []
    return DiscoverOptions(flags.repair_checkpoint, flags.wheelhouse), argv


def engine_options(ctx: Context, flags: DeployFlags, subjects: Subjects
                   ) -> tuple[EngineOptions, list[str]]:
    recapture, restart = subjects.get("recapture"), subjects.get("restart")
    argv = ["engines"]
    argv += ["--recapture", ",".join(recapture)] if recapture else []
    argv += ["--restart", ",".join(restart)] if restart else []
    return EngineOptions(tuple(recapture) if recapture else None,
                         tuple(restart) if restart else None), argv


FABRIC_FLAGS = (("--seconds", "seconds"), ("--omit", "omit_s"), ("--parallel", "parallel"),
                ("--port", "port"))


def fabric_parameters(ctx: Context) -> dict[str, Any] | None:
    """The test parameters Gate D's newest passed attempt measured with (its plan), or None.
    Newest passed, not the gate's state: after a blocked attempt (a shaped link) the edges
    that passed are reused only under the parameters they were measured with."""
    attempt = last_passed_attempt(ctx.ledger, "fabric")
    if attempt is None:
        return None
    parameters = (attempt_plan(ctx.ledger, "fabric", attempt) or {}).get("parameters")
    return dict(parameters) if isinstance(parameters, dict) else None


def fabric_choice(kept: Mapping[str, Any] | None, seconds: int | None,
                  omit: int | None = None) -> tuple[FabricOptions, list[str]]:
    """Gate D's options for deploy: the parameters its last pass measured with (`kept`; they
    are part of every link record: others would measure every edge again, not only those
    whose links moved); the operator's --fabric-seconds and --fabric-omit win."""
    chosen = dict(kept or {})
    if seconds is not None:
        chosen["seconds"] = seconds
    if omit is not None:
        chosen["omit_s"] = omit
    given = {key: chosen[key] for _, key in FABRIC_FLAGS if isinstance(chosen.get(key), int)}
    argv = ["fabric"]
    for flag, key in FABRIC_FLAGS:
        argv += [flag, str(given[key])] if key in given else []
    return FabricOptions(**given), argv


def fabric_options(ctx: Context, flags: DeployFlags, subjects: Subjects
                   ) -> tuple[FabricOptions, list[str]]:
    return fabric_choice(fabric_parameters(ctx), flags.fabric_seconds, flags.fabric_omit)


COMMANDS: dict[str, GateCommand[Any]] = {c.name: c for c in (
    GateCommand("discover", gate_runs.run_discover, gate_tables.discover_table,
                discover_options, shown=lambda r: {
                    "engines": r["engines"],
                    **({"checkpoint": r["checkpoint"]} if "checkpoint" in r else {})},
                blocked_after="; nothing was generated"),
    GateCommand("install", gate_runs.run_install, gate_tables.install_table, install_options),
    GateCommand("engines", gate_runs.run_engines, gate_tables.engines_table, engine_options),
    GateCommand("fabric", gate_runs.run_fabric, gate_tables.fabric_table, fabric_options),
    GateCommand("attest", gate_runs.run_attest, gate_tables.attest_table, plain("attest")),
    GateCommand("preflight", gate_runs.run_preflight, gate_tables.preflight_table,
                plain("preflight")),
    GateCommand("serve", gate_runs.run_serve, gate_tables.serve_table, plain("serve")),
)}
