"""The profile gate (a current, well-fitting row per engine) and the slo gate (targets feasible).

A row measured on another engine process (generation differs) prices a process that no longer
runs, so the router would hold that engine out; the fix is to re-profile that one engine. A
fit with a large error (or leave-one-out error, which catches an over-fit) would misprice it.
"""

from __future__ import annotations

from narwhal.core.errors import InputError
from narwhal.core.fleet import beside
from narwhal.core.profiles import load_profiles
from narwhal.serve.engine_client import EngineCallFailed
from narwhal.serve.preflight.state import CheckState
from narwhal.serve.preflight.verdicts import Verdict, failed, passed, seconds, skipped


def _store_problem(state: CheckState) -> str | None:
    """Load the store into `state`; a reason when it cannot be used at all."""
    fleet = state.fleet
    if fleet.profiles is None:
        return ("the fleet document has no profiles section; run narwhal-profile --fleet "
                f"{state.fleet_path} and add profiles: {{\"path\": ...}}")
    path = beside(state.fleet_path, fleet.profiles.path)
    try:
        state.store = load_profiles(path, model=fleet.model,
                                    engine_ids=tuple(e.id for e in fleet.engines))
    except InputError as exc:
        return f"{exc}".replace("\n", " ") + f"; run narwhal-profile --fleet {state.fleet_path}"
    return None


async def profile(state: CheckState) -> list[Verdict]:
    opts = state.options
    problem = _store_problem(state)
    out: list[Verdict] = []
    if problem is not None:
        for e in state.engines:
            state.fail("profile", e.id)
        return [failed("profile", "fleet", "no usable store", "a narwhal.profiles store", problem)]
    assert state.store is not None
    budget = f"live generation; fit_error <= {opts.max_fit_error:g}, loo_error <= {opts.max_loo_error:g}"
    fix_one = f"run narwhal-profile --fleet {state.fleet_path} --only"
    for e in state.engines:
        blocked = state.blocker("profile", e.id)
        if blocked:
            out.append(skipped("profile", e.id, blocked))
            continue
        row = state.store.row(e.id)
        if row is None:
            state.fail("profile", e.id)
            out.append(failed("profile", e.id, "no row", budget,
                              f"the store has no row for {e.id}; {fix_one} {e.id}"))
            continue
        try:
            live = await state.clients[e.id].generation()
        except EngineCallFailed as exc:
            state.fail("profile", e.id)
            out.append(failed("profile", e.id, "generation unreadable", budget, str(exc)))
            continue
        state.generations[e.id] = live
        if row.generation != live:
            state.fail("profile", e.id)
            out.append(failed(
                "profile", e.id, f"live: {live.describe()}", f"profiled: {row.generation.describe()}",
                f"{e.id} is not the process that was profiled (restarted or upgraded): live "
                f"{live.describe()}, profiled {row.generation.describe()}; {fix_one} {e.id}"))
            continue
        worst = [(f"{curve}.{name}", value, limit, flag)
                 for curve, fit in (("prefill", row.prefill), ("decode", row.decode))
                 for name, value, limit, flag in (
                     ("fit_error", fit.fit_error, opts.max_fit_error, "--max-fit-error"),
                     ("loo_error", fit.loo_error, opts.max_loo_error, "--max-loo-error"))
                 if value > limit]
        measured = (f"fit {row.prefill.fit_error:.3f}/{row.decode.fit_error:.3f}, "
                    f"loo {row.prefill.loo_error:.3f}/{row.decode.loo_error:.3f}")
        if worst:
            state.fail("profile", e.id)
            text = "; ".join(f"{n} {v:.3f} > {lim:g} (flag {f})" for n, v, lim, f in worst)
            out.append(failed("profile", e.id, measured, budget,
                              f"{e.id}'s curves fit poorly: {text}; re-profile on an idle engine "
                              f"({fix_one} {e.id}) or loosen the flag"))
            continue
        out.append(passed("profile", e.id, measured, budget, "generation matches"))
    return out


async def slo(state: CheckState) -> list[Verdict]:
    """slo.ttft_s above each prefill-capable engine's floor, slo.tpot_s above each decode floor."""
    ctx = state.options.slo_context_tokens
    target = state.fleet.slo
    out: list[Verdict] = []
    for e in state.engines:
        blocked = state.blocker("slo", e.id)
        row = state.store.row(e.id) if state.store is not None else None
        if blocked or row is None:
            out.append(skipped("slo", e.id, blocked or f"no profile row for {e.id}"))
            continue
        checks: list[tuple[str, float, float, str]] = []
        if e.role in ("prefill", "both"):
            checks.append(("ttft_s", row.prefill.seconds(ctx), target.ttft_s,
                           f"prefill of a {ctx}-token prompt"))
        if e.role in ("decode", "both"):
            checks.append(("tpot_s", row.decode.step_s(ctx, 1), target.tpot_s,
                           f"one decode step, 1 request, {ctx} resident tokens"))
        for name, floor, goal, what in checks:
            subject = f"{e.id} {name}"
            measured = f"floor {seconds(floor)}"
            budget = f"slo.{name} {goal:g} s > floor"
            if goal <= floor:
                out.append(failed("slo", subject, measured, budget,
                                  f"slo.{name} {goal:g} s is not above {e.id}'s profiled floor "
                                  f"{floor:.4f} s ({what}); no schedule can meet it on {e.id}: "
                                  f"raise slo.{name} or use faster engines", floor_s=floor,
                                  target_s=goal, engine=e.id))
            else:
                out.append(passed("slo", subject, measured, budget, what, floor_s=floor,
                                  target_s=goal, engine=e.id))
    return out
