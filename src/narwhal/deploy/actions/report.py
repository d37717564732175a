"""How `narwhal deploy` ends: stopped before any gate (a host not as pinned), stopped at a gate,
or passed; one JSON document with --json, else lines on stderr."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from narwhal.core.cli_common import EXIT_FAILED, EXIT_OK
from narwhal.deploy.actions.context import Context
from narwhal.deploy.actions.status import rows_now

if TYPE_CHECKING:
    from narwhal.deploy.actions.deploy import Plan, Step

Say = Callable[[str], None]
ACCESS_FIX = ("a host whose key changed: verify the new key out of band, then `narwhal hosts "
              "trust --replace ALIAS`; a host that does not answer: check it is up and "
              "reachable")


def no_access(ctx: Context, as_json: bool, access: dict[str, Any], say: Say) -> int:
    entry = ctx.ledger.load().get("activities", {}).get("access", {})
    folder = ctx.ledger.attempt_folder("access", entry["last"]) if entry.get("last") else \
        ctx.ledger.root
    if as_json:
        print(json.dumps({"deployment": ctx.ledger.deployment, "verdict": "stopped",
                          "stopped_at": "access", "cause": entry.get("cause", ""),
                          "hosts": access["output"], "fix": ACCESS_FIX,
                          "evidence": str(folder), "steps": []}, indent=1))
    else:
        say("[red]narwhal deploy: stopped before gate A: not every host answers as pinned[/] "
            "(above, per host)")
        say(f"  evidence: {folder}")
        say(f"  fix: {ACCESS_FIX}; then narwhal deploy")
    return EXIT_FAILED


def stopped(ctx: Context, plan: Plan, steps: list[Step], say: Say) -> int:
    spec = steps[-1].spec
    entry = ctx.ledger.load()["gates"].get(spec.name, {})
    attempt = entry.get("last", "")
    folder = ctx.ledger.attempt_folder(spec.name, attempt) if attempt else ctx.ledger.root
    # a gate refused before it recorded an attempt (its inputs): its own words are the cause
    said = steps[-1].output if isinstance(steps[-1].output, str) else ""
    cause = said if entry.get("state") == "passed" or not entry.get("cause") else \
        str(entry["cause"])
    if plan.as_json:
        print(json.dumps({"deployment": ctx.ledger.deployment, "verdict": "stopped",
                          "stopped_at": spec.name, "cause": cause or "",
                          "evidence": str(folder), "steps": [s.as_dict() for s in steps],
                          "status": [r.as_dict() for r in rows_now(ctx, plan.specs)]},
                         indent=1))
    else:
        say(f"[red]narwhal deploy: stopped at gate {spec.letter} {spec.name}, "
            f"{entry.get('state', 'not passed')}[/]: {cause or 'see above'}")
        say(f"  evidence: {folder}")
        say(f"  inspect: narwhal status; after fixing the cause: narwhal deploy (gates "
            f"before {spec.letter} that are still fresh are kept); to undo what the attempt "
            f"created: narwhal recover {spec.name}")
    return EXIT_FAILED


def finished(ctx: Context, plan: Plan, steps: list[Step], seconds: float, say: Say,
             access: str) -> int:
    until = plan.specs[plan.until]
    if plan.as_json:
        rows = rows_now(ctx, plan.specs)
        print(json.dumps({"deployment": ctx.ledger.deployment, "verdict": "passed",
                          "until": until.name, "seconds": round(seconds, 3),
                          "access": access,
                          "steps": [s.as_dict() for s in steps],
                          "status": [r.as_dict() for r in rows]}, indent=1))
        return EXIT_OK
    ran = [s for s in steps if s.action == "ran"]
    say(f"narwhal deploy: gates A..{until.letter} passed in {seconds:.1f} s; ran "
        f"{', '.join(s.spec.letter for s in ran) or 'nothing'}, kept "
        f"{', '.join(s.spec.letter for s in steps if s.action == 'kept') or 'nothing'}")
    for s in ran:
        say(f"  gate {s.spec.letter} {s.spec.name}: {s.seconds:.1f} s")
    return EXIT_OK
