"""Gate B: package and install the approved revision, offline and hash-verified.

Plan (no host touched): the prepared run (package/prepared.py) from the revision, the
revision's runtime.lock, Gate A's passed launch records and draft fleet document, and each
role's files; every host's Python checked against the lock from Gate A's facts. Execute:
every physical host at once, one install each however many roles it carries. On a host:
the install lock, the files (a part file each, sha256-checked, linked into place; an
identical file already there is kept, a different one refused and left as it is), the clone
of the bundle (HEAD the revision, a clean tree), the venv from the wheelhouse alone (skipped
while its stamp names these requirements), each role's fleet-side command run with --help,
then the `installed` marker. A rerun after any cut picks up where the host is.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narwhal.core.documents import stamp
from narwhal.core.errors import GateBlocked, HostError, InputError, Problem
from narwhal.deploy.gates.handoff import passed_artifact
from narwhal.deploy.gates.install_relay import RelayTree, pull
from narwhal.deploy.gates.install_rules import (
    checkout_refusal,
    file_action,
    install_outcome,
    marker_stale,
    pip_needed,
)
from narwhal.deploy.gates.parallel import each
from narwhal.deploy.gates.spec import Reads
from narwhal.deploy.hosts import commandline as cl
from narwhal.deploy.hosts.base import Host
from narwhal.deploy.hosts.sessions import Sessions, physical_hosts
from narwhal.deploy.inputs.model import Inputs
from narwhal.deploy.ledger import Ledger
from narwhal.deploy.ledger.attempt import Attempt
from narwhal.deploy.package import prepared as prep
from narwhal.deploy.package import source
from narwhal.deploy.package.lock import Lock
from narwhal.deploy.package.rolefiles import role_files

DISCOVERY = Reads("discover", "discovery.json")
FLEET_DRAFT = Reads("discover", "fleet-draft.json")
READS = (DISCOVERY, FLEET_DRAFT)  # its spec: gates/registry.py
RESULT_SCHEMA = "narwhal.install-result"
PIP_TIMEOUT_S = 900.0
Progress = Callable[[str, str], None]


@dataclass(frozen=True)
class GateA:
    """What Gate B takes from Gate A's passed attempt, each verified by its recorded digest."""

    upstream: dict[str, str]  # artifact -> sha256, recorded in the manifest
    launch: dict[str, bytes]  # engine role -> launch record
    fleet: bytes
    facts: dict[str, dict[str, Any]]  # host alias -> host facts


def read_gate_a(ledger: Ledger, inputs: Inputs) -> GateA:
    upstream: dict[str, str] = {}
    launch: dict[str, bytes] = {}
    facts: dict[str, dict[str, Any]] = {}
    for read in (DISCOVERY, FLEET_DRAFT):
        upstream[read.artifact] = passed_artifact(ledger, "install", read).sha256
    fleet = passed_artifact(ledger, "install", FLEET_DRAFT).read_bytes()
    for e in inputs.engines:
        art = passed_artifact(ledger, "install", Reads("discover", f"launch-{e.role}.json"))
        launch[e.role], upstream[art.name] = art.read_bytes(), art.sha256
    for host in physical_hosts(inputs):
        art = passed_artifact(ledger, "install", Reads("discover", f"host-facts-{host.alias}.json"))
        facts[host.alias], upstream[art.name] = art.json(), art.sha256
    return GateA(upstream, launch, fleet, facts)


def python_problems(facts: dict[str, dict[str, Any]], lock: Lock) -> list[Problem]:
    """Every host must build the venv from the lock's wheels: its Python, with venv."""
    problems = []
    want = lock.python_minor
    for alias, f in facts.items():
        py = f.get("python") or {}
        version = str(py.get("version") or "")
        got = tuple(int(x) for x in version.split(".")[:2] if x.isdigit())
        if got != want:
            problems.append(Problem(f"{alias}: python3", f"Python {version or 'missing'} "
                                    f"(Gate A's facts); the wheelhouse is for "
                                    f"{want[0]}.{want[1]} ({lock.python})",
                                    f"install python{want[0]}.{want[1]} with venv on the host "
                                    "and run `narwhal discover` again"))
        elif not py.get("has_venv"):
            problems.append(Problem(f"{alias}: python3", "the venv module is missing "
                                    "(Gate A's facts)", "install python3-venv on the host and "
                                    "run `narwhal discover` again"))
    return problems


def plan(inputs: Inputs, ledger: Ledger, runs: Path, checkout: Path,
         wheelhouse_dir: Path | None, progress: Progress) -> prep.Prepared:
    """The prepared run; every bad input is an InputError or GateBlocked before any send."""
    root = source.checkout_root(checkout)
    revision = source.resolve(root, inputs.revision)
    lock_bytes, lock = prep.revision_lock(root, revision)
    gate_a = read_gate_a(ledger, inputs)
    problems = python_problems(gate_a.facts, lock)
    hosts = {h.alias: list(h.roles) for h in physical_hosts(inputs)}
    roles = role_files(inputs, [r for rs in hosts.values() for r in rs])
    if problems:
        raise GateBlocked("install", "; ".join(p.line() for p in problems[:3]), problems)
    built = prep.build_inputs(runs, root, revision, lock_bytes, lock, wheelhouse_dir, progress)
    run_id = prep.prepare(ledger, inputs.deployment, revision, lock, built, hosts, roles,
                          gate_a.launch, gate_a.fleet, gate_a.upstream)
    return load_prepared(ledger, run_id, inputs)


def load_prepared(ledger: Ledger, run_id: str, inputs: Inputs) -> prep.Prepared:
    """A prepared run written earlier, its secrets taken from the `.env` again."""
    folder = ledger.root / "deployment-env" / run_id
    try:
        raw = (folder / "manifest.json").read_bytes()
        manifest, manifest_sha = json.loads(raw), hashlib.sha256(raw).hexdigest()
    except (OSError, ValueError) as exc:
        raise InputError(str(folder), [Problem("--prepared", f"no readable prepared run "
                                               f"{run_id} ({exc})", "name a folder under "
                                               f"{ledger.root / 'deployment-env'}")]) from None
    if manifest.get("revision") != inputs.revision:
        raise InputError(str(folder), [Problem("--prepared", f"prepared for revision "
                                               f"{manifest.get('revision')}, the .env approves "
                                               f"{inputs.revision}", "prepare a new run")])
    hosts = {h["alias"]: h["roles"] for h in manifest["hosts"]}
    roles = role_files(inputs, [r for rs in hosts.values() for r in rs])
    at_run = f"runs/{run_id}/"
    packages = []
    for h in manifest["hosts"]:
        pkg = prep.HostPackage(h["alias"], h["roles"], smoke=h["smoke"],
                               requirements=h["requirements"].replace("@run/", at_run))
        for f in h["files"]:
            remote = f["remote"].replace("@run/", at_run)
            pkg.files.append(prep.SendFile(remote, Path(f["local"]) if f["local"] else None,
                                           f["sha256"]))
            if f["secret"]:
                name = remote.split("/secrets/", 1)[1]  # a name, or env/<VARIABLE>
                value = next((rf.secrets[name] for r, rf in roles.items()
                              if r in h["roles"] and name in rf.secrets), None)
                if value is None:
                    raise InputError(str(folder), [Problem(name, "the prepared run sends this "
                                                           "secret but the .env no longer "
                                                           "has it", "prepare a new run")])
                pkg.secrets[remote] = value
        whole = folder / "manifest.json"
        pkg.files.append(prep.SendFile(f"{at_run}manifest.json", whole, manifest_sha))
        packages.append(pkg)
    return prep.Prepared(run_id, folder, manifest["revision"],
                         manifest["remote_dir"].removeprefix("~/"), packages, manifest)


def plan_document(p: prep.Prepared) -> dict[str, Any]:
    return {"prepared_run": p.run_id, "folder": str(p.folder), "revision": p.revision,
            "remote_dir": f"~/{p.remote_dir}", "hosts": [
                {"alias": h.alias, "roles": h.roles, "files": len(h.files),
                 "smoke": h.smoke} for h in p.hosts]}


# --- on the hosts ------------------------------------------------------------------------

def _boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def _owner(attempt: Attempt) -> str:
    """Who holds an install lock: this process on this workstation, in this boot."""
    with open(f"/proc/{os.getpid()}/stat") as f:
        ticks = cl.parse_start_ticks(f.read())
    return json.dumps({"workstation": socket.gethostname(), "boot": _boot_id(),
                       "pid": os.getpid(), "start": ticks, "attempt": attempt.id},
                      sort_keys=True)


def _owner_gone(text: str) -> bool:
    """True only when the holder is provably gone: this workstation and boot, pid not the
    same process any more. A holder on another workstation is never presumed dead."""
    try:
        held = json.loads(text)
        if held["workstation"] != socket.gethostname():
            return False
        if held["boot"] != _boot_id():
            return True
        with open(f"/proc/{int(held['pid'])}/stat") as f:
            return bool(cl.parse_start_ticks(f.read()) != held["start"])
    except FileNotFoundError:
        return True
    except (ValueError, KeyError, TypeError, OSError):
        return False


def _take_lock(host: Host, path: str, owner: str) -> None:
    for _ in range(2):
        got = host.run(cl.lock_take(path, owner))
        if got.ok:
            return
        if got.exit_status != 3:
            got.check()
        holder = got.text.strip()
        if not _owner_gone(holder):
            raise HostError(host.alias, f"another install holds {path} ({holder[:200]}); wait "
                            "for it to finish, or remove the file if that installer is gone")
        host.run(cl.lock_drop(path, holder), check=True)  # stale: its owner is gone
    raise HostError(host.alias, f"could not take {path}")


def _ensure_dir(host: Host, attempt: Attempt, path: str) -> None:
    if host.stat_dir(path) is None:
        attempt.make_dir(host, path)


def _send(host: Host, attempt: Attempt, base: str, pkg: prep.HostPackage,
          relayed: set[str]) -> tuple[int, int]:
    """Every file not `relayed` in place: (sent, already there). A different file at a
    target is refused."""
    sent = present = 0
    for f in pkg.files:
        if f.remote in relayed:
            continue
        target = f"{base}/{f.remote}"
        data = pkg.secrets[f.remote].encode() if f.local is None else f.local.read_bytes()
        # A local file's digest was checked against the manifest just before (changed_files).
        want = f.sha256 or hashlib.sha256(data).hexdigest()
        existing = host.stat_file(target)
        action = file_action(None if existing is None else existing[1], want)
        if action == "refuse":
            raise HostError(host.alias, f"{target} already exists with other content; it "
                            "was left as it is: move it away, or prepare a new run")
        if action == "keep":
            present += 1
            continue
        attempt.create_file(host, target, data)
        sent += 1
    return sent, present


def install_dir(host: Host, remote_dir: str) -> str:
    """The absolute install directory on host; remote_dir is under the login's home (`~/`).
    Gate B installs there; Gate C and the role shells run from there."""
    return f"{host.home()}/{remote_dir.removeprefix('~/')}"


def installed_tool(host: Host, remote_dir: str, name: str) -> str:
    """The absolute path of one of the revision's console scripts in the installed venv."""
    return f"{install_dir(host, remote_dir)}/venv/bin/{name}"


def _checkout(host: Host, attempt: Attempt, base: str, revision: str,
              progress: Progress) -> tuple[str, bool]:
    """The clean clone of the revision in place: (its HEAD, whether this attempt cloned it)."""
    checkout = f"{base}/checkout"
    state = host.run(cl.checkout_state(checkout))
    cloned = False
    if not state.ok:
        progress(host.alias, "cloning the revision")
        host.run(cl.clone_bundle(checkout, f"{base}/revision.bundle", source.BRANCH),
                 timeout=300, check=True)
        attempt.own_tree(host, checkout)
        state, cloned = host.run(cl.checkout_state(checkout), check=True), True
    head, changed = state.text.split()
    if (refused := checkout_refusal(head, changed, revision)) is not None:
        raise HostError(host.alias, f"{checkout} {refused}; move it away and rerun")
    return head, cloned


def install_host(host: Host, attempt: Attempt, p: prep.Prepared, pkg: prep.HostPackage,
                 owner: str, tree: RelayTree, progress: Progress) -> dict[str, Any]:
    base = install_dir(host, p.remote_dir)
    _ensure_dir(host, attempt, base.rsplit("/", 1)[0])
    _ensure_dir(host, attempt, base)
    for sub in sorted({f.remote.rsplit("/", 1)[0] for f in pkg.files if "/" in f.remote},
                      key=lambda d: (d.count("/"), d)):
        parts = sub.split("/")
        for depth in range(1, len(parts) + 1):
            _ensure_dir(host, attempt, f"{base}/{'/'.join(parts[:depth])}")
    lock = f"{base}/.install-lock"
    _take_lock(host, lock, owner)
    try:
        relayed, pulled = pull(tree, host, attempt, base, pkg, progress)
        progress(host.alias, "sending")
        sent, present = _send(host, attempt, base, pkg, relayed)
        present += len(relayed) - pulled
        tree.serve(host, attempt, base)
        head, cloned = _checkout(host, attempt, base, p.revision, progress)
        venv = f"{base}/venv"
        reqs = next(f for f in pkg.files if f.remote == pkg.requirements)
        pip_ran = pip_needed(host.run(cl.venv_stamp(venv), check=True).text.strip(),
                             reqs.sha256)
        if pip_ran:
            progress(host.alias, "installing from the wheelhouse")
            fresh = host.stat_dir(venv) is None
            host.run(cl.venv_create(venv), timeout=300, check=True)
            if fresh:
                attempt.own_tree(host, venv)
            run_dir = f"{base}/runs/{p.run_id}"
            host.run(cl.pip_install_offline(venv, [f"{base}/wheelhouse", f"{run_dir}/wheels"],
                                            f"{base}/{pkg.requirements}"),
                     timeout=PIP_TIMEOUT_S, check=True)
            host.run(cl.write_marker(f"{venv}/.narwhal-complete", str(reqs.sha256)), check=True)
        for command in pkg.smoke:
            host.run([f"{venv}/bin/{command}", "--help"], check=True)
        marker = host.run(cl.read_file(f"{base}/installed"))
        verified = not marker_stale(marker.ok, marker.text, p.revision)
        if not verified:
            host.run(cl.write_marker(f"{base}/installed", p.revision), check=True)
        current = host.run(cl.read_file(f"{base}/current"))
        if marker_stale(current.ok, current.text, p.run_id):
            host.run(cl.write_marker(f"{base}/current", p.run_id), check=True)
        said, recorded = install_outcome(verified, pip_ran, sent + pulled)
        progress(host.alias, said)
        return stamp(RESULT_SCHEMA, 1, {
            "host": host.alias, "roles": pkg.roles, "dir": base, "revision": p.revision,
            "head": head, "files_sent": sent, "files_present": present,
            "files_relayed": pulled, "relayed_from": tree.parents[host.alias] if relayed
            else None, "cloned": cloned,
            "pip_ran": pip_ran, "smoke": pkg.smoke,
            "outcome": recorded})
    finally:
        host.run(cl.lock_drop(lock, owner))


def execute(sessions: Sessions, attempt: Attempt, p: prep.Prepared,
            progress: Progress) -> dict[str, Any]:
    changed = prep.changed_files(p)
    if changed:
        raise GateBlocked("install", f"prepared input changed: {', '.join(changed[:3])}"
                          f"{' ...' if len(changed) > 3 else ''}", [Problem(
                              path, "prepared input changed since the run was prepared",
                              "correct the input and prepare a new run (`narwhal install`)")
                              for path in changed])
    owner = _owner(attempt)
    tree = RelayTree(p.hosts, {a: h.destination.host for a, h in sessions.hosts.items()})

    def one(pkg: prep.HostPackage) -> dict[str, Any]:
        host = sessions.get(pkg.alias)
        try:
            with attempt.bind(host):
                return install_host(host, attempt, p, pkg, owner, tree, progress)
        finally:
            tree.release(pkg.alias)

    try:
        outcomes = each(p.hosts, one)
    finally:
        with attempt.bind(*(s.host for s in tree.serving)):
            tree.stop()
    results: dict[str, dict[str, Any]] = {}
    problems = []
    for outcome in outcomes:
        alias = outcome.item.alias
        if outcome.error is not None:
            if not isinstance(outcome.error, HostError):
                raise outcome.error
            progress(alias, "failed")
            problems.append(Problem(f"{alias}: install", str(outcome.error).splitlines()[0],
                                    "fix the cause on the host, then run `narwhal install` "
                                    "again (it resumes)"))
            continue
        assert outcome.value is not None
        results[alias] = outcome.value
        attempt.add_json(f"install-{alias}.json", outcome.value)
    if problems:
        attempt.block(problems=problems)
    return {"prepared_run": p.run_id, "revision": p.revision, "hosts": results}
