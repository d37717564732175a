"""Which engines are no longer what Gate E attested, and exactly the work each needs again.

`narwhal status` asks every sidecar of the attested fleet, from the router host (the peer that
relies on them), whether it still vouches for the contract the fleet document names. The
runbook's repeat rows decide the rest:
- the engine process changed (a restart with the same launch plan) or its layout changed:
  capture it again (unless Gate C already holds a capture newer than the attestation), attest
  it again, profile it, run the full preflight; the fabric only when the new capture's geometry
  differs, which Gate D's fingerprint then shows by itself;
- the sidecar cannot be read, or vouches for another digest: attest again (its own document is
  rebuilt from the same capture, so nothing measured on the engine is lost);
- the engine is not running at all (crashed, or its host restarted; asked of its own host
  when the sidecar says the process is gone or cannot be read): start it again from its
  checked plan and capture it (`narwhal engines --restart`), then as for a restart.
Engines whose sidecar vouches need nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from narwhal.core import result_line
from narwhal.core.engine_attestation import parse_attestation
from narwhal.core.errors import ContractError, GateBlocked, HostError, InputError, LedgerError
from narwhal.core.sidecar_answer import read_answer
from narwhal.deploy.gates.handoff import passed_artifact, passed_attempt
from narwhal.deploy.gates.spec import Reads
from narwhal.deploy.hosts.base import Host
from narwhal.deploy.ledger import Ledger

COMMAND = "narwhal-attest"


@dataclass(frozen=True)
class EngineChange:
    engine: str
    reason: str
    repeat: tuple[str, ...]
    recapture: bool  # Gate C must capture it again first
    restart: bool = False  # ... and start it first: it is not running

    def as_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "reason": self.reason, "repeat": list(self.repeat),
                "recapture": self.recapture, "restart": self.restart}


# Whether an engine's own host says it runs: True, False, or None when it cannot be asked.
Running = Callable[[str], bool | None]


def attested_fleet(ledger: Ledger) -> dict[str, Any] | None:
    """The fleet document Gate E's last passed attempt finalised, or None before that."""
    if passed_attempt(ledger, "attest") is None:
        return None
    try:
        return dict(passed_artifact(ledger, "status", Reads("attest", "fleet.json")).json())
    except (GateBlocked, LedgerError):
        return None


def _captured_since(ledger: Ledger, engine: str) -> bool:
    """Gate C holds a capture of another process than the one attested (recaptured since)."""
    try:
        cap = passed_artifact(ledger, "status", Reads("engines", f"cache-layout-{engine}.json"))
        att = passed_artifact(ledger, "status", Reads("attest", f"attestation-{engine}.json"))
        attested = parse_attestation(att.json(), str(att.path)).process \
            .process_start_time_seconds
    except (GateBlocked, LedgerError, InputError):
        return False
    return bool(cap.json().get("process_start_time_seconds") != attested)


def judge(engine: dict[str, Any], got: result_line.ResultLine) -> tuple[str, bool]:
    """(why the sidecar does not vouch for the fleet's contract, whether the engine itself
    changed); ("", False) when it vouches. The reading is the router's own (core)."""
    if not got.ok:
        return f"the sidecar cannot be read ({got.error[:200]})", False
    reading = read_answer(int(got.data.get("status", 0)), got.data.get("document") or {},
                          str(engine["contract"]["attestation_digest"]))
    return reading.reason, reading.process_changed


def _repeat(engine: str, process_changed: bool, recaptured: bool,
            restart: bool = False) -> tuple[str, ...]:
    if not process_changed and not restart:
        return (f"attestation: `narwhal attest` (replaces the sidecar of {engine} only)",)
    steps = [f"start and capture: `narwhal engines --restart {engine}` (from its checked "
             "plan)"] if restart else \
        [] if recaptured else [f"capture: `narwhal engines --recapture {engine}`"]
    return (*steps,
            f"attestation: `narwhal attest` (replaces the sidecar of {engine} only)",
            f"profile of {engine}: `narwhal-profile --only {engine}` on the router host",
            "full preflight: narwhal-check on the router host (gate F)",
            "fabric: only when the new capture's geometry differs (gate D then shows stale)")


def sidecar_answers(router: Host, tool: str, urls: list[str]
                    ) -> list[result_line.ResultLine]:
    """Every sidecar's answer, asked from the router host in one round trip (`fetch-many`),
    as a fetch of each URL would have reported it, in the order given."""
    argv = [tool, "fetch-many", *(a for url in urls for a in ("--url", url)), "--timeout", "5"]
    done = router.run(argv, timeout=30)
    try:
        got = result_line.parse(done.text, f"{COMMAND} fetch-many")
    except ContractError:
        raise HostError(router.alias, f"`{COMMAND} fetch-many` printed no result line") from None
    answers = got.data.get("answers") if got.ok else None
    if not isinstance(answers, list) or len(answers) != len(urls):
        raise HostError(router.alias, f"`{COMMAND} fetch-many` answered for "
                        f"{len(answers) if isinstance(answers, list) else 0} of {len(urls)} "
                        f"sidecars{': ' + got.error[:200] if got.error else ''}")
    return [result_line.ResultLine(
        command=f"{COMMAND} fetch", ok=bool(a.get("ok")), error=str(a.get("error") or ""),
        data={k: a[k] for k in ("status", "document") if k in a}) if isinstance(a, dict)
        else result_line.ResultLine(command=f"{COMMAND} fetch", ok=False,
                                    error="fetch-many answered a non-object")
        for a in answers]


def changed_engines(ledger: Ledger, router: Host, tool: str,
                    running: Running | None = None) -> list[EngineChange]:
    """Every attested engine whose sidecar does not vouch for the fleet's contract now, read
    from the router host in one command for them all; HostError when the host is
    unreachable. `running` asks an engine's own host whether it still runs, for the engines
    whose sidecar says their process is gone or cannot be read."""
    fleet = attested_fleet(ledger)
    if fleet is None:
        return []
    engines = [e for e in fleet.get("engines", [])
               if e.get("attestation_url") and e.get("contract")]
    if not engines:
        return []
    answers = sidecar_answers(router, tool, [str(e["attestation_url"]) for e in engines])
    out = []
    for engine, got in zip(engines, answers, strict=True):
        why, process_changed = judge(engine, got)
        if not why:
            continue
        down = running is not None and (process_changed or not got.ok) and \
            running(engine["id"]) is False
        if down:
            out.append(EngineChange(engine["id"], f"{why}; its host says it is not running",
                                    _repeat(engine["id"], True, False, restart=True),
                                    True, restart=True))
            continue
        recaptured = process_changed and _captured_since(ledger, engine["id"])
        out.append(EngineChange(engine["id"], why,
                                _repeat(engine["id"], process_changed, recaptured),
                                process_changed and not recaptured))
    return out
