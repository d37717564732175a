"""`narwhal-check`: preflight gates over a live fleet, or `--calibrate-first-token`.

    narwhal-check --fleet FLEET.json [--captures DIR] [--only GATES] [--ring] [--json]
                  [--evidence PATH] [budget flags]
    narwhal-check --fleet FLEET.json --calibrate-first-token [--calibration-out PATH]

Everything the user wrote (flags, the fleet document, a calibration it names, the evidence
path) is checked before any engine is called: a problem there is exit 2 and nothing is
measured. Then the gates run (preflight/runner.py); exit 0 when none failed (skips are listed),
1 when one did. The human table (or, with --json, one JSON document) goes to stdout; progress
to stderr; the evidence file (0600) beside the fleet document unless --evidence says where.
Without --json the last stdout line is the NARWHAL_RESULT line the workstation parses.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from narwhal.core import result_line
from narwhal.core.calibration import load_calibration
from narwhal.core.cli_common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from narwhal.core.errors import InputError, Problem
from narwhal.core.flag_types import number
from narwhal.core.fleet import beside, engine_key, load_fleet
from narwhal.core.kv.events import EventBatch
from narwhal.core.private_file import write_private_json
from narwhal.serve.engine_client import EngineCallFailed, clients
from narwhal.serve.preflight import report
from narwhal.serve.preflight.calibrate import CalibrationFailed, calibrate
from narwhal.serve.preflight.canary import CanaryFailed, record_canary
from narwhal.serve.preflight.captures import load_captures
from narwhal.serve.preflight.options import CalibrateOptions, CheckOptions
from narwhal.serve.preflight.runner import run_gates
from narwhal.serve.preflight.state import NEEDS, CheckState
from narwhal.serve.preflight.verdicts import GATES, Verdict, failed
from narwhal.serve.router.cache.fleet import FleetCache, PromptKeys
from narwhal.serve.router.cache.index import EngineCache
from narwhal.serve.router.control.attestation import attested_engines

COMMAND = "narwhal-check"
DESCRIPTION = ("Preflight (gate F): reach, model, profile, pace, tokenize, KV events, the "
               "live KV contract on every producer->consumer pair, contract and SLO feasibility; or calibrate "
               "the first-token deadline.")
CALIBRATION_GATES = ("reach", "model", "profile", "tokenize")
DEFAULT_CALIBRATION = "first-token-calibration.json"
DEFAULT_CANARY = "kv-canary.json"


class RouterIndex:
    """The router's cache state for one engine fed by its events (the events gate's index):
    the same EngineCache, keys and matched-token rule the router places with."""

    def __init__(self) -> None:
        self.cache = EngineCache("events", 0)
        self.fleet = FleetCache({"engine": self.cache})

    @property
    def batches(self) -> int:
        return self.cache.counts["batches"]

    def apply(self, batch: EventBatch) -> None:
        self.cache.apply(batch)

    def refused(self) -> None:
        self.cache.refused()

    def matched_tokens(self, token_ids: Sequence[int]) -> int:
        return self.fleet.matched_tokens(PromptKeys(token_ids))["engine"]


def _gate_list(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in GATES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown) or 'nothing'} is not a gate; "
                                         f"use one or more of {', '.join(GATES)}")
    return names


def with_needs(names: tuple[str, ...]) -> tuple[str, ...]:
    """The named gates and, transitively, the gates they need, in run order."""
    want = set(names)
    while True:
        more = {n for g in want for n in NEEDS.get(g, ())} - want
        if not more:
            return tuple(g for g in GATES if g in want)
        want |= more


def _parser() -> argparse.ArgumentParser:
    d, c = CheckOptions(), CalibrateOptions()
    p = argparse.ArgumentParser(prog=COMMAND, description=DESCRIPTION,
                                epilog="Exit 0: no gate failed; 1: a gate failed; 2: bad input, "
                                       "nothing measured. See docs/preflight.md.")
    p.add_argument("--fleet", required=True, type=Path, metavar="FLEET.json",
                   help="the narwhal.fleet v1 document")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    p.add_argument("--evidence", type=Path, metavar="PATH",
                   help="evidence file to write (default: preflight-<UTC time>.json beside the fleet)")
    p.add_argument("--captures", type=Path, metavar="DIR",
                   help="Gate C's evidence for the contract gate: launch-<id>.json and "
                        "cache-layout-<id>.json per engine (without it the gate is SKIP)")
    p.add_argument("--only", type=_gate_list, metavar="GATE[,GATE]",
                   help="run only these gates (and the ones they need): "
                        + ", ".join(GATES))
    p.add_argument("--ring", action="store_true",
                   help="kv gate on a subset: each engine produces for the next and consumes from "
                        "the previous (n pairs instead of n(n-1))")
    f = float
    p.add_argument("--reach-timeout", type=number(f, 0.1, 600), default=d.reach_timeout_s,
                   help=f"seconds for /health and /version (default {d.reach_timeout_s:g})")
    p.add_argument("--call-timeout", type=number(f, 1, 3600), default=d.call_timeout_s,
                   help=f"seconds for any other engine call (default {d.call_timeout_s:g})")
    p.add_argument("--max-fit-error", type=number(f, 0, 10), default=d.max_fit_error,
                   help=f"largest profile fit_error accepted (default {d.max_fit_error:g})")
    p.add_argument("--max-loo-error", type=number(f, 0, 10), default=d.max_loo_error,
                   help=f"largest profile loo_error accepted (default {d.max_loo_error:g})")
    p.add_argument("--pace-tokens", type=number(int, 8, 100_000), default=d.pace_tokens,
                   help=f"prompt tokens of a pace probe (default {d.pace_tokens})")
    p.add_argument("--pace-repeats", type=number(int, 1, 50), default=d.pace_repeats,
                   help=f"pace probes per engine (default {d.pace_repeats})")
    p.add_argument("--pace-factor", type=number(f, 1, 1000), default=d.pace_factor,
                   help=f"allowed multiple of prediction and fleet median (default {d.pace_factor:g})")
    p.add_argument("--pace-slack", type=number(f, 0, 60), default=d.pace_slack_s,
                   help=f"seconds added to both pace budgets (default {d.pace_slack_s:g})")
    p.add_argument("--events-timeout", type=number(f, 0.1, 600), default=d.events_timeout_s,
                   help="seconds for an engine's KV events publisher to answer and for its "
                        f"blocks to arrive (default {d.events_timeout_s:g})")
    p.add_argument("--kv-tokens", type=number(int, 16, 100_000), default=d.kv_tokens,
                   help=f"prompt tokens of a kv handoff probe (default {d.kv_tokens})")
    p.add_argument("--slo-context", type=number(int, 1, 10_000_000), default=d.slo_context_tokens,
                   help=f"context tokens the SLO floors assume (default {d.slo_context_tokens})")
    p.add_argument("--calibrate-first-token", action="store_true",
                   help="sample first-token times per pair and length; write a calibration")
    p.add_argument("--calibration-out", type=Path, metavar="PATH",
                   help="where the calibration goes (default: the fleet's calibration.path, "
                        f"else {DEFAULT_CALIBRATION} beside the fleet)")
    p.add_argument("--canary-out", type=Path, metavar="PATH",
                   help="where the live KV canary's reference goes (recorded with the "
                        f"calibration; default: {DEFAULT_CANARY} beside the calibration)")
    p.add_argument("--calibrate-repeats", type=number(int, 1, 100), default=c.repeats,
                   help=f"samples per pair and length (default {c.repeats})")
    p.add_argument("--calibrate-safety", type=number(f, 1, 100), default=c.safety_factor,
                   help=f"safety factor on the worst p95 (default {c.safety_factor:g})")
    p.add_argument("--calibrate-max-tokens", type=number(int, 16, 1_000_000), default=c.max_tokens,
                   help=f"longest calibration prompt (default {c.max_tokens})")
    return p


def _options(args: argparse.Namespace) -> tuple[CheckOptions, CalibrateOptions]:
    check = CheckOptions(
        reach_timeout_s=args.reach_timeout, call_timeout_s=args.call_timeout,
        max_fit_error=args.max_fit_error, max_loo_error=args.max_loo_error,
        pace_tokens=args.pace_tokens, pace_repeats=args.pace_repeats,
        pace_factor=args.pace_factor, pace_slack_s=args.pace_slack, kv_tokens=args.kv_tokens,
        events_timeout_s=args.events_timeout,
        ring=args.ring, slo_context_tokens=args.slo_context)
    return check, CalibrateOptions(repeats=args.calibrate_repeats,
                                   safety_factor=args.calibrate_safety,
                                   max_tokens=args.calibrate_max_tokens)


def _prepare(args: argparse.Namespace) -> tuple[CheckState, Path, Path | None]:
    """Everything the user wrote, checked before any engine is called (InputError: exit 2)."""
    fleet = load_fleet(args.fleet)
    check, _ = _options(args)
    state = CheckState(fleet=fleet, fleet_path=args.fleet, options=check, clients={},
                       engine_key=engine_key(fleet, args.fleet), event_index=RouterIndex)
    if args.captures is not None:
        state.captures = load_captures(args.captures, fleet)
    if fleet.calibration is not None:
        state.calibration_path = beside(args.fleet, fleet.calibration.path)
        state.calibration = load_calibration(state.calibration_path)
        if state.calibration.model != fleet.model:
            raise InputError(str(args.fleet), [Problem(
                "calibration.path", f"{state.calibration_path} calibrated model "
                f"{state.calibration.model!r}, the fleet serves {fleet.model!r}",
                "re-run narwhal-check --calibrate-first-token on this fleet")])
    now = datetime.now(UTC)
    evidence = args.evidence or report.evidence_path(args.fleet, now)
    if args.evidence is not None and (args.evidence.exists() or not args.evidence.parent.is_dir()):
        raise InputError("--evidence", [Problem(
            str(args.evidence), "exists already (evidence is written once)"
            if args.evidence.exists() else "is in a folder that does not exist",
            "name a new file in an existing folder, or leave --evidence out")])
    out = None
    if args.calibrate_first_token:
        out = args.calibration_out or (state.calibration_path
                                       or beside(args.fleet, DEFAULT_CALIBRATION))
        if not out.parent.is_dir():
            raise InputError("--calibration-out", [Problem(
                str(out), "is in a folder that does not exist", "name a file in an existing folder")])
        if args.only:
            raise InputError("--only", [Problem(
                ",".join(args.only), "does not combine with --calibrate-first-token (it runs "
                "the gates calibration needs)", "drop --only")])
        if args.canary_out is not None and not args.canary_out.parent.is_dir():
            raise InputError("--canary-out", [Problem(
                str(args.canary_out), "is in a folder that does not exist",
                "name a file in an existing folder")])
    elif args.canary_out is not None:
        raise InputError("--canary-out", [Problem(
            str(args.canary_out), "only means something with --calibrate-first-token",
            "add --calibrate-first-token or drop --canary-out")])
    elif args.calibration_out is not None:
        raise InputError("--calibration-out", [Problem(
            str(args.calibration_out), "only means something with --calibrate-first-token",
            "add --calibrate-first-token or drop --calibration-out")])
    return state, evidence, out


def _progress(name: str) -> None:
    print(f"{COMMAND}: {name} gate...", file=sys.stderr, flush=True)


async def _run(state: CheckState, args: argparse.Namespace,
               calibration_out: Path | None) -> tuple[list[Verdict], dict[str, Any]]:
    extra: dict[str, Any] = {}
    _, cal_opts = _options(args)
    async with aiohttp.ClientSession() as session:
        state.clients = clients(((e.id, e.url) for e in state.engines), session,
                                state.options.call_timeout_s, attested_engines(state.engines),
                                state.engine_key)
        if calibration_out is None:
            only = with_needs(args.only) if args.only else None
            return await run_gates(state, only, _progress), extra
        verdicts = await run_gates(state, CALIBRATION_GATES, _progress)
        if any(v.status == "fail" for v in verdicts):
            return verdicts, extra
        _progress("calibration")
        try:
            cal = await calibrate(state, cal_opts)
        except CalibrationFailed as exc:
            verdicts.append(failed("calibration", "fleet", "no candidate", "every pair sampled",
                                   str(exc)))
            return verdicts, extra
        _progress("kv canary")
        try:
            canary = await record_canary(state)
        except (CanaryFailed, EngineCallFailed) as exc:
            verdicts.append(failed("canary", "fleet", "no reference", "every pair agrees",
                                   str(exc)))
            return verdicts, extra
    write_private_json(calibration_out, cal.document())
    extra = {"calibration": str(calibration_out), "candidate_s": cal.candidate_s, "rule": cal.rule}
    if canary is not None:
        out = args.canary_out or calibration_out.with_name(DEFAULT_CANARY)
        write_private_json(out, canary.document())
        extra["kv_canary"] = str(out)
    return verdicts, extra


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        state, evidence_path, calibration_out = _prepare(args)
    except InputError as exc:
        print(f"{COMMAND}: {exc}", file=sys.stderr)
        print(result_line.render(COMMAND, False, error=str(exc).splitlines()[0]))
        return EXIT_BAD_INPUT
    started = datetime.now(UTC)
    verdicts, extra = asyncio.run(_run(state, args, calibration_out))
    mode = "calibrate-first-token" if calibration_out else ("check --ring" if args.ring else "check")
    if args.only:  # a partial run says so in its evidence, so it is never taken for a full one
        mode += " --only " + ",".join(with_needs(args.only))
    doc = report.evidence(state, verdicts, started, datetime.now(UTC), mode)
    doc.update(extra)
    report.write_evidence(evidence_path, doc)
    doc["evidence"] = str(evidence_path)
    if args.json:
        report.print_json(doc, sys.stdout)
    else:
        report.print_table(doc, sys.stdout)
        if extra:
            print(f"calibrated first-token candidate: {extra['candidate_s']:g} s, written to "
                  f"{extra['calibration']}\nrule: {extra['rule']}")
        print(f"evidence: {evidence_path}")
        summary = {"summary": doc["summary"], "evidence": str(evidence_path), **extra}
        print(result_line.render(COMMAND, doc["ok"], summary,
                                 error="" if doc["ok"] else "a preflight gate failed"))
    return EXIT_OK if doc["ok"] else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
