"""`narwhal-profile`: measures prefill and decode cost curves of each live engine for the router (gate F).

Order of work, cheapest refusal first: flags and the fleet document (exit 2), the output files
(an existing store without --overwrite: exit 2, before anything is measured), then every engine's
facts at once (generation, limits, idle), then the sweeps (hosts in parallel, the engines of one
host `--per-host` at a time, default one), the generation again, the fit. The store
is written only when every profiled engine produced a row (all or nothing: exit 1 otherwise,
with nothing written), because a store missing an engine would leave the router unable to price
it, which is worse than keeping the last complete store.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from rich.console import Console

from narwhal.core import result_line
from narwhal.core.cli_common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from narwhal.core.errors import InputError, Problem
from narwhal.core.flag_types import increasing_ints, number
from narwhal.core.fleet import FleetDocument, beside, engine_key, load_fleet
from narwhal.core.profiles import now_utc
from narwhal.core.secret import Secret
from narwhal.serve.engine_client import EngineCallFailed, EngineClient
from narwhal.serve.profiler import plan as sweep_plan
from narwhal.serve.profiler.plan import SweepPlan, SweepSettings, plan_for
from narwhal.serve.profiler.progress import Reporter, reporter
from narwhal.serve.profiler.report import EngineOutcome, overlap_notes, print_table, result_document
from narwhal.serve.profiler.rows import RowRefused, build_row, sample_records
from narwhal.serve.profiler.store_io import (
    Target,
    check_target,
    samples_lines,
    store_document,
    write_all,
)
from narwhal.serve.profiler.sweep import EngineBusy, EngineFacts, measure, read_facts
from narwhal.serve.router.control.attestation import attested_engines

DESCRIPTION = "Measures prefill and decode cost curves of each live engine for the router (gate F)."
DEFAULT_TIMEOUT_S = 120.0


_positive = number(int, 1, 1_000_000)
_increasing = increasing_ints()
_seconds = number(float, 0, 3600, above_low=True)

COMMAND = "narwhal-profile"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="narwhal-profile", description=DESCRIPTION)
    p.add_argument("--fleet", required=True, type=Path, help="the narwhal.fleet document")
    p.add_argument("--out", type=Path, help="the profile store to write (default: the fleet's profiles.path)")
    p.add_argument("--samples", type=Path, help="the raw samples file (default: <out>.samples.jsonl)")
    p.add_argument("--only", action="append", default=[], metavar="IID",
                   help="re-profile only this engine (repeatable); other rows stay as they are")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing store (with --only: replace those engines' rows)")
    p.add_argument("--repeats", type=_positive, default=sweep_plan.DEFAULT_REPEATS,
                   help="samples per prompt length; the fit uses their median (default 3)")
    p.add_argument("--prefill-lengths", type=_increasing, metavar="N,N,...",
                   help="prompt lengths in tokens (default: 8 from 32 up to the engine's limit, at most 4096)")
    p.add_argument("--cover", type=_positive, metavar="N",
                   help="the longest prompt measured is at least N tokens (a workload's "
                        "prompt length: the curves then cover it, not extrapolate to it)")
    p.add_argument("--decode-concurrency", type=_increasing, metavar="C,C,...",
                   default=sweep_plan.DEFAULT_CONCURRENCY, help="concurrent streams (default 1,2,4,8)")
    p.add_argument("--decode-contexts", type=_increasing, metavar="N,N,...",
                   help="prompt tokens of each decode stream (default 64 and up to 1024 as the KV cache allows)")
    p.add_argument("--decode-tokens", type=_positive, default=sweep_plan.DEFAULT_DECODE_TOKENS,
                   help="tokens generated per decode stream (default 32; at least 8)")
    p.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT_S,
                   help="seconds one engine call may take (default 120)")
    p.add_argument("--per-host", type=_positive, default=1, metavar="N",
                   help="engines of one host measured at the same time (default 1: engines "
                        "sharing a host's CPUs would record each other's load); hosts always "
                        "run in parallel")
    p.add_argument("--json", action="store_true", help="print one JSON result object instead of a table")
    return p


@dataclass(frozen=True)
class Job:
    """Everything settled before the first engine call."""

    fleet: FleetDocument
    engines: tuple[tuple[str, str], ...]  # (id, url) of the engines to profile, fleet order
    settings: SweepSettings
    target: Target
    timeout_s: float
    per_host: int = 1
    engine_key: Secret | None = None  # the engines' API key (fleet: engine_auth)


def settle(args: argparse.Namespace) -> Job:
    """Flags + fleet + output files, or InputError naming every problem (exit 2)."""
    fleet = load_fleet(args.fleet)
    ids = tuple(e.id for e in fleet.engines)
    problems: list[Problem] = []
    for iid in args.only:
        if iid not in ids:
            problems.append(Problem("--only", f"{iid!r} is not an engine of this fleet",
                                    f"use one of: {', '.join(ids)}"))
    if args.decode_tokens < 8:
        problems.append(Problem("--decode-tokens", f"{args.decode_tokens} leaves too few steps to "
                                "time", "use 8 or more"))
    if args.out is not None:
        store = args.out
    elif fleet.profiles is not None:
        store = beside(args.fleet, fleet.profiles.path)
    else:
        store = None
        problems.append(Problem("--out", "the fleet document has no profiles.path",
                                "add profiles.path to the fleet document or pass --out"))
    if problems or store is None:
        raise InputError("narwhal-profile", problems)
    samples = args.samples or store.with_name(store.name + ".samples.jsonl")
    only = tuple(dict.fromkeys(args.only))
    target = check_target(store, samples, model=fleet.model, only=only, overwrite=args.overwrite)
    settings = SweepSettings(args.repeats, args.prefill_lengths, args.decode_concurrency,
                             args.decode_contexts, args.decode_tokens, args.cover)
    engines = tuple((e.id, e.url) for e in fleet.engines if not only or e.id in only)
    return Job(fleet, engines, settings, target, args.timeout, args.per_host,
               engine_key(fleet, args.fleet))


async def _facts(clients: dict[str, EngineClient], model: str
                 ) -> dict[str, EngineFacts | BaseException]:
    got = await asyncio.gather(*(read_facts(c, model) for c in clients.values()),
                               return_exceptions=True)
    return dict(zip(clients, got, strict=True))


async def _profile_one(client: EngineClient, model: str, plan: SweepPlan, facts: EngineFacts,
                       report: Callable[[str, int, int], None]) -> tuple[EngineOutcome, list[dict[str, Any]]]:
    started = time.monotonic()
    notes: tuple[str, ...] = ()
    try:
        m = await measure(client, model, plan, facts.generation, report)
        notes = overlap_notes(client.id, m)
        report("fit", 0, 1)
        row = build_row(client.id, m, now_utc())
    except (EngineCallFailed, RowRefused) as exc:
        report("failed", 1, 1)
        return EngineOutcome(client.id, None, str(exc), time.monotonic() - started, notes), []
    report("done", 1, 1)
    return (EngineOutcome(client.id, row, None, time.monotonic() - started, notes),
            sample_records(client.id, m))


def _for_engine(progress: Reporter, engine_id: str) -> Callable[[str, int, int], None]:
    def report(phase: str, done: int, total: int) -> None:
        progress.update(engine_id, phase, done, total)
    return report


async def run(job: Job, progress: Reporter) -> tuple[list[EngineOutcome], list[dict[str, Any]]]:
    """Facts of every engine, then (all idle and planned) the sweeps, host by host."""
    model = job.fleet.model
    async with aiohttp.ClientSession() as session:
        attested = attested_engines(job.fleet.engines)
        clients = {eid: EngineClient(eid, url, session, job.timeout_s, attested.get(eid),
                                     job.engine_key) for eid, url in job.engines}
        facts = await _facts(clients, model)
        outcomes: list[EngineOutcome] = []
        plans: dict[str, tuple[SweepPlan, EngineFacts]] = {}
        problems: list[Problem] = []
        for eid, got in facts.items():
            if isinstance(got, EngineBusy | EngineCallFailed):
                outcomes.append(EngineOutcome(eid, None, str(got), 0.0))
            elif isinstance(got, BaseException):
                raise got
            else:
                plan, trouble = plan_for(eid, job.settings, got.limits)
                problems += trouble
                if plan is not None:
                    plans[eid] = (plan, got)
        if problems:
            raise InputError("narwhal-profile", problems)
        if outcomes:  # a busy or unreachable engine: measure nothing rather than a partial store
            failed = {o.engine_id for o in outcomes}
            return [*outcomes, *(EngineOutcome(eid, None, f"{eid}: not measured: another engine failed "
                                               "its checks (all or nothing)", 0.0)
                                 for eid in clients if eid not in failed)], []
        urls = dict(job.engines)

        async def one_host(ids: list[str]) -> list[tuple[EngineOutcome, list[dict[str, Any]]]]:
            slots = asyncio.Semaphore(job.per_host)
            for eid in ids[job.per_host:]:
                progress.update(eid, "queued (host busy)", 0, 1)

            async def one(eid: str) -> tuple[EngineOutcome, list[dict[str, Any]]]:
                async with slots:
                    return await _profile_one(clients[eid], model, plans[eid][0], plans[eid][1],
                                              _for_engine(progress, eid))
            return list(await asyncio.gather(*(one(eid) for eid in ids)))

        with progress:
            per_host = await asyncio.gather(*(one_host(ids) for ids in by_host(list(plans), urls)))
        finished = {o.engine_id: (o, lines) for group in per_host for o, lines in group}
        done = [finished[eid] for eid in plans]
    return [o for o, _ in done], [line for _, lines in done for line in lines]


def by_host(engine_ids: list[str], urls: dict[str, str]) -> list[list[str]]:
    """Engines grouped by the host their URL names, in fleet order. Engines on one host share
    its CPUs (each API server and engine core needs a core) and memory bandwidth, so measured
    together each would record the other's load as its own step time, and its decode curve
    would fit far worse than measured alone (docs/profile.md, "What it measures", has the
    fit errors of two real CPU engines on one host). Hosts are measured in parallel, the
    engines of one host `--per-host` at a time."""
    groups: dict[str, list[str]] = {}
    for eid in engine_ids:
        host = (urlsplit(urls[eid]).hostname or urls[eid]).lower()
        groups.setdefault(host, []).append(eid)
    return list(groups.values())


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    started = time.monotonic()
    try:
        job = settle(args)
        outcomes, lines = asyncio.run(run(job, reporter(tuple(eid for eid, _ in job.engines))))
    except InputError as exc:
        print(f"narwhal-profile: {exc}", file=sys.stderr)
        if not args.json:
            print(result_line.render(COMMAND, False, error=str(exc).splitlines()[0]))
        return EXIT_BAD_INPUT
    ok = all(o.row is not None for o in outcomes)
    if ok:
        rows = [o.row for o in outcomes if o.row is not None]
        fleet_ids = tuple(e.id for e in job.fleet.engines)
        document = store_document(job.target, job.fleet.model, rows, fleet_ids)
        try:
            write_all(job.target, document,
                      samples_lines(job.target, job.fleet.model, tuple(r.engine_id for r in rows), lines))
        except OSError as exc:
            print(f"narwhal-profile: cannot write {exc.filename or job.target.store}: {exc.strerror}; "
                  "choose a writable --out", file=sys.stderr)
            return EXIT_FAILED
    elapsed = time.monotonic() - started
    if args.json:
        print(json.dumps(result_document(outcomes, written=ok, store=str(job.target.store),
                                         samples=str(job.target.samples), elapsed_s=elapsed)))
    else:
        print_table(outcomes, Console(width=None if sys.stdout.isatty() else 160))
    for o in outcomes:
        for note in o.notes:
            print(f"narwhal-profile: note: {note}", file=sys.stderr)
        if o.error:
            print(f"narwhal-profile: {o.error}", file=sys.stderr)
    if not args.json:  # the last stdout line: what a gate on the workstation parses
        summary = result_document(outcomes, written=ok, store=str(job.target.store),
                                  samples=str(job.target.samples), elapsed_s=elapsed)
        for engine in summary["engines"]:
            engine.pop("row")  # the rows are in the store; the line stays short
        print(result_line.render(COMMAND, ok, summary, error="" if ok else next(
            (o.error for o in outcomes if o.error), "an engine was not profiled")))
    if not ok:
        print(f"narwhal-profile: nothing written ({job.target.store} is as it was)", file=sys.stderr)
        return EXIT_FAILED
    print(f"narwhal-profile: wrote {job.target.store} and {job.target.samples} "
          f"({len(outcomes)} engine(s), {elapsed:.1f} s)", file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
