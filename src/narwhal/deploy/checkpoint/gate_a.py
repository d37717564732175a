"""Staging as part of Gate A: pin the revision, compare every engine host with it, fetch what
is missing (and, with the operator's consent, what differs), then hold every host to the hub.

Gate A because the checkpoint is one of the inputs Gate A freezes (the runbook's discovery
records "the model" and its evidence row is the checkpoint manifests and model_tree_sha256),
and because its recovery row is Gate A's: "for checkpoint mismatch repair the differing file
and repeat discovery". Staging before the probe's checks keeps one gate's evidence whole: the
pin, what each host had, what was fetched and how, and the digests that passed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narwhal.core.errors import GateBlocked, LedgerError, Problem
from narwhal.core.secret import Secret
from narwhal.deploy.checkpoint import manifest as mf
from narwhal.deploy.checkpoint import pin
from narwhal.deploy.checkpoint.kit import Kit
from narwhal.deploy.checkpoint.stage import Staged, stage
from narwhal.deploy.gates.handoff import passed_artifact
from narwhal.deploy.gates.spec import Reads
from narwhal.deploy.hosts.sessions import Sessions, physical_hosts
from narwhal.deploy.inputs.model import Inputs
from narwhal.deploy.ledger import Ledger
from narwhal.deploy.ledger.attempt import Attempt

PIN = Reads("discover", "checkpoint.json")
REPAIR_FLAG = "--repair-checkpoint"
Progress = Callable[[str, str], None]
Reprobe = Callable[[list[str]], dict[str, dict[str, Any]]]


@dataclass(frozen=True)
class StagePlan:
    manifest: mf.Manifest
    repair: bool
    kit: Callable[[], tuple[Kit, Path]]  # the kit and its archive, built only when needed
    token: Secret | None
    reused: bool  # the pin came from an earlier Gate A, not from the hub now
    cache: Path  # the workstation's hub cache
    previous: mf.Manifest | None = None  # the pin this one replaces (the revision moved)

    def document(self) -> dict[str, Any]:
        m = self.manifest
        return {"repo_id": m.repo_id, "revision": m.revision, "commit": m.commit,
                "endpoint": m.endpoint, "files": len(m.files),
                "bytes": sum(f.size for f in m.files), "tree_sha256": m.digest(),
                "pinned_earlier": self.reused, "repair": self.repair}


def previous(ledger: Ledger) -> mf.Manifest | None:
    """The pin of the last Gate A that passed with one (None: none yet)."""
    try:
        return mf.Manifest.model_validate_json(
            passed_artifact(ledger, "discover", PIN, through_failures=True).read_bytes())
    except (GateBlocked, LedgerError, ValueError):
        return None


def plan(inputs: Inputs, ledger: Ledger, cache: Path, kit: Callable[[], tuple[Kit, Path]],
         repair: bool) -> StagePlan | None:
    """The pin to stage (None: no MODEL_REPO_ID, the checkpoint is what hosts hold)."""
    source = inputs.checkpoint
    if source is None:
        return None
    earlier = previous(ledger)
    if earlier is not None and pin.reusable(earlier, source):
        return StagePlan(earlier, repair, kit, inputs.hf_token, True, cache)
    try:
        manifest = pin.resolve(source, inputs.hf_token, cache)
    except pin.PinError as exc:
        raise GateBlocked("discover", exc.problems[0].line(), exc.problems) from None
    return StagePlan(manifest, repair, kit, inputs.hf_token, False, cache,
                     earlier if earlier is not None and earlier.commit != manifest.commit
                     else None)


def model_dirs(inputs: Inputs) -> dict[str, str]:
    """Engine host alias -> its model dir (colocated engines share one: discover checks)."""
    out = {}
    for h in physical_hosts(inputs):
        engines = [e for e in inputs.engines if e.role in h.roles]
        if engines:
            out[h.alias] = engines[0].model_dir
    return out


def refusal(d: mf.HostDiff, m: mf.Manifest) -> list[Problem]:
    """A host whose files stand in the way, file by file (the first five of each kind)."""
    at = f"{m.repo_id}@{m.commit[:12]}"
    damaged = [p for p in d.differs if p not in d.stale]
    foreign = [p for p in d.extra if p not in d.retired]
    out = [Problem(f"{d.host}: {p}", f"differs from {at} (size or sha256)",
                   f"rerun with {REPAIR_FLAG} to fetch exactly this file again") for p in
           damaged[:5]]
    out += [Problem(f"{d.host}: {p}", f"is in the model dir but not in {at}",
                    "move it out of the model dir (vLLM would read it), then rerun") for p in
            foreign[:5]]
    return out


def _rows(facts: Mapping[str, Any]) -> list[Any]:
    model = facts.get("model") or {}
    return list(model.get("rows") or []) if model.get("exists") else []


def failures(staged: list[Staged], m: mf.Manifest) -> list[Problem]:
    out = []
    for s in staged:
        if s.outcome in ("unreachable", "failed"):
            why = s.error or ("cannot reach the hub" if s.outcome == "unreachable" else "failed")
            fix = (f"set {pin.TOKEN_FIELD} to a token granted access to {m.repo_id}"
                   if "Gated" in str(s.error) else "check the host reaches the hub "
                   "(HF_ENDPOINT) or another engine host, then rerun discovery")
            field = pin.TOKEN_FIELD if "Gated" in str(s.error) else f"{s.host}: checkpoint"
            out.append(Problem(field, f"{s.host}: staging {m.repo_id}@{m.commit[:12]}: {why}",
                               fix))
    return out


def run(inputs: Inputs, sessions: Sessions, attempt: Attempt, sp: StagePlan,
        facts: dict[str, dict[str, Any]], reprobe: Reprobe, progress: Progress
        ) -> list[Problem]:
    """Stage what each engine host lacks; the facts of hosts that changed are measured again.
    Evidence: checkpoint.json (the pin) and staging.json (what each host had and got)."""
    dirs = model_dirs(inputs)
    m = sp.manifest
    attempt.add_json("checkpoint.json", m.model_dump(mode="json"))
    diffs = [mf.compare(h, m, _rows(facts.get(h) or {}), sp.previous)
             for h in dirs if h in facts]
    fetches, refused = mf.fetch_plan(diffs, sp.repair)
    problems = [p for d in refused for p in refusal(d, m)]
    staged: list[Staged] = []
    if fetches:
        staged = stage(sessions, attempt, m, fetches, dirs, sp.kit, sp.token, progress,
                       lambda path: pin.local_file(m, sp.token, sp.cache, path))
        facts.update(reprobe([s.host for s in staged if s.files]))
        problems += failures(staged, m)
    kept = [Staged(d.host, "kept") for d in diffs if d.matches]
    attempt.add_json("staging.json", {
        "pin": sp.document(), "hosts": [s.as_json() for s in [*kept, *staged]],
        "refused": [{"host": d.host, "differs": list(d.differs), "extra": list(d.extra)}
                    for d in refused],
        "replaces": sp.previous.commit if sp.previous is not None else None,
        "bytes": {"from_hub": sum(s.hub_bytes for s in staged),
                  "from_workstation": sum(s.kit_bytes + s.relayed_bytes for s in staged),
                  "relayed": sum(s.relayed_bytes for s in staged),
                  "between_hosts": 0}})
    held = {d.host for d in refused}  # named file by file above
    return problems + hub_problems(m, facts, {h: v for h, v in dirs.items() if h not in held})


def hub_problems(m: mf.Manifest, facts: Mapping[str, Mapping[str, Any]],
                 dirs: Mapping[str, str]) -> list[Problem]:
    """Every engine host's tree must be the pinned revision's (after staging)."""
    out = []
    for host in dirs:
        model = (facts.get(host) or {}).get("model") or {}
        if not model.get("exists") or model.get("model_tree_sha256") == m.digest():
            continue  # a missing dir is discover's own problem
        d = mf.compare(host, m, _rows(facts.get(host) or {}))
        first = (d.missing + d.differs + d.extra or ("(unknown file)",))[0]
        out.append(Problem(f"{host}: MODEL_DIR", f"checkpoint is not {m.repo_id}@"
                           f"{m.commit[:12]}: first differing file {first}",
                           f"rerun discovery with {REPAIR_FLAG}"))
    return out


def discovered(sp: StagePlan) -> dict[str, Any]:
    """discovery.json's checkpoint: the pin and the model card (None: the repo has none)."""
    m = sp.manifest
    return {**sp.document(), "gated": m.gated,
            "card": m.card.model_dump(mode="json") if m.card is not None else None}
