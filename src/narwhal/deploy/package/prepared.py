"""A prepared run (the runbook's runs/deployment-env/<run>/): everything Gate B will send.

Preparing touches no host. It resolves the revision, checks the wheelhouse against the
revision's own runtime.lock, builds (once per revision, cached under runs/builds/) the bundle
and Narwhal's wheels, cuts each role's files and writes them with a manifest that names
every file by sha256, per physical host, and the remote directory. Installing re-hashes every
local file against the manifest first: anything edited since is "prepared input changed"
and nothing is sent. Secret files are never written here; their values are taken from the
`.env` when sent, and the manifest names them without their digest.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from narwhal.core.documents import canonical_json, sha256_bytes, stamp
from narwhal.core.errors import InputError, Problem
from narwhal.deploy.ledger import Ledger
from narwhal.deploy.package import source, wheelhouse
from narwhal.deploy.package.lock import Lock, parse_lock
from narwhal.deploy.package.rolefiles import RoleFiles

SCHEMA = "narwhal.prepared-run"
REMOTE_ROOT = "Narwhal-deploy"  # under the login's home on every host
# Which fleet-side command proves each role's install runs (`--help` from the venv).
SMOKE = {"engine": "narwhal-engine", "router": "narwhal-serve"}


@dataclass(frozen=True)
class SendFile:
    remote: str  # path under the remote install directory
    local: Path | None  # None: a secret, sent from memory
    sha256: str | None  # None for a secret (its digest is not recorded)

    def as_json(self) -> dict[str, Any]:
        return {"remote": self.remote, "local": str(self.local) if self.local else None,
                "sha256": self.sha256, "secret": self.local is None}


@dataclass
class HostPackage:
    alias: str
    roles: list[str]
    files: list[SendFile] = field(default_factory=list)
    secrets: dict[str, str] = field(default_factory=dict)  # remote path -> value
    smoke: list[str] = field(default_factory=list)
    requirements: str = "requirements.txt"


@dataclass
class Prepared:
    run_id: str
    folder: Path
    revision: str
    remote_dir: str  # relative to the login's home
    hosts: list[HostPackage]
    manifest: dict[str, Any]


def remote_dir(deployment: str, revision: str) -> str:
    return f"{REMOTE_ROOT}/{deployment}-{revision[:12]}"


def revision_lock(checkout: Path, revision: str) -> tuple[bytes, Lock]:
    """runtime.lock as the revision has it (not the working tree's)."""
    done = subprocess.run(["git", "-C", str(checkout), "show", f"{revision}:runtime.lock"],
                          capture_output=True, timeout=60, check=False)
    if done.returncode != 0:
        raise InputError(str(checkout), [Problem(
            source.FIELD, f"{revision[:12]} has no runtime.lock", "approve a revision that "
            "has one (scripts/lock_runtime.py writes it)")])
    return done.stdout, parse_lock(done.stdout.decode("utf-8", "replace"),
                                   f"{revision[:12]}:runtime.lock")


def _write(ledger: Ledger, folder: Path, name: str, data: bytes) -> SendFile:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    ledger.writer.create(path, data)
    return SendFile(name, path, sha256_bytes(data))


def _cached(path: Path) -> SendFile:
    return SendFile("", path, wheelhouse.file_sha256(path))


def build_inputs(runs: Path, checkout: Path, revision: str, lock_bytes: bytes, lock: Lock,
                 given_wheelhouse: Path | None, progress: Any) -> dict[str, SendFile]:
    """The revision's bundle and wheels, and the runtime wheels, built or reused, each with
    its sha256 (the runtime wheels' are the lock's, which `verify` has just matched)."""
    builds = runs / "builds" / revision
    builds.mkdir(parents=True, exist_ok=True, mode=0o700)
    bundle = builds / "revision.bundle"
    if not bundle.exists():
        progress("workstation", "bundling the revision")
        part = builds / f"revision.bundle.part-{os.getpid()}"
        part.unlink(missing_ok=True)
        source.make_bundle(checkout, revision, part)
        os.replace(part, bundle)
    lock_path = builds / "runtime.lock"
    if not lock_path.exists():
        lock_path.write_bytes(lock_bytes)
    if given_wheelhouse is not None:
        wheels = wheelhouse.verify(given_wheelhouse, lock)
    else:
        progress("workstation", "checking the runtime wheelhouse")
        wheels = wheelhouse.build(runs / "wheelhouse" / sha256_bytes(lock_bytes)[:16],
                                  lock_path, lock)
    out = {f"wheel:{pin.name}": SendFile("", path, pin.sha256) for pin, path in wheels.items()}
    out["bundle"] = _cached(bundle)
    progress("workstation", "building narwhal-fleet (pure)")
    out["narwhal:pure"] = _cached(source.build_wheel(bundle, revision, builds / "pure",
                                                     compiled=False))
    progress("workstation", "building narwhal-fleet (compiled request path, once per revision)")
    out["narwhal:compiled"] = _cached(source.build_wheel(bundle, revision, builds / "compiled",
                                                         compiled=True))
    return out


def run_id_for(revision: str, parts: dict[str, str]) -> str:
    """A prepared run is named by what it holds: the same inputs prepare the same run (reused,
    and checked file by file), a changed input a new one beside it on the hosts."""
    return f"{revision[:12]}-{sha256_bytes(canonical_json(parts).encode())[:12]}"


def prepare(ledger: Ledger, deployment: str, revision: str, lock: Lock,
            built: dict[str, SendFile], hosts: dict[str, list[str]], roles: dict[str, RoleFiles],
            launch: dict[str, bytes], fleet: bytes, upstream: dict[str, str]) -> str:
    """Write the prepared run and return its id (an identical run prepared before is kept).

    `hosts` maps each physical host to its roles. On a host, what every run shares (the
    bundle, the runtime wheels) sits at the top of the install directory; what a run holds
    (role files, Narwhal's wheel, requirements, manifest) under runs/<run>/."""
    runtime = [f for k, f in sorted(built.items()) if k.startswith("wheel:")]
    bundle = built["bundle"]
    plans: list[tuple[HostPackage, dict[str, bytes]]] = []
    digest_parts: dict[str, str] = {"revision": revision, "bundle": str(bundle.sha256)}
    for alias, host_roles in hosts.items():
        pkg = HostPackage(alias, list(host_roles))
        narwhal = built["narwhal:compiled" if "router" in host_roles else "narwhal:pure"]
        assert narwhal.local is not None and bundle.local is not None
        pkg.files.append(SendFile("revision.bundle", bundle.local, bundle.sha256))
        for w in runtime:
            assert w.local is not None
            pkg.files.append(SendFile(f"wheelhouse/{w.local.name}", w.local, w.sha256))
        small: dict[str, bytes] = {}
        reqs = "".join(f"{p.requirement}\n" for p in lock.pins) + \
            f"narwhal-fleet==0.1.0 --hash=sha256:{narwhal.sha256}\n"
        small["requirements.txt"] = reqs.encode()
        for role in host_roles:
            rf = roles[role]
            small[f"env/{role}.env"] = rf.env_text.encode()
            for name, value in sorted(rf.secrets.items()):
                pkg.secrets[f"secrets/{name}"] = value
                digest_parts[f"{alias}:secrets/{name}"] = sha256_bytes(value.encode())
            if role == "router":
                small["fleet.json"] = fleet
            else:
                small[f"launch/{role}.json"] = launch[role]
        pkg.smoke = sorted({SMOKE["router" if r == "router" else "engine"] for r in host_roles})
        for name, data in small.items():
            digest_parts[f"{alias}:{name}"] = sha256_bytes(data)
        digest_parts[f"{alias}:narwhal"] = str(narwhal.sha256)
        plans.append((pkg, small))
        pkg.files.append(SendFile(f"@run/wheels/{narwhal.local.name}", narwhal.local,
                                  narwhal.sha256))
    run_id = run_id_for(revision, digest_parts)
    folder = ledger.root / "deployment-env" / run_id
    if not folder.exists():
        _write_run(ledger, folder, plans, {
            "run": run_id, "deployment": deployment, "revision": revision,
            "remote_dir": f"~/{remote_dir(deployment, revision)}", "upstream": upstream,
            "lock": {"python": lock.python, "platform": lock.platform,
                     "wheels": len(lock.pins)}})
    # Indexed here, however the run came to exist, so a run prepared before the index named
    # prepared runs is named the next time it is used.
    ledger.name_in_runbook(f"deployment-env/{run_id}", f"deployment-env/{run_id}")
    return run_id


def _write_run(ledger: Ledger, folder: Path, plans: list[tuple[HostPackage, dict[str, bytes]]],
               header: dict[str, Any]) -> None:
    """Write the run's files and manifest beside `folder`, then rename them into place at once,
    so a half-written run is never taken for a prepared one."""
    part = folder.parent / f".{folder.name}.part-{os.getpid()}"
    part.mkdir(parents=True, mode=0o700)
    packages = []
    for pkg, small in plans:
        for name, data in small.items():
            local = f"{pkg.alias}/{name}"
            f = _write(ledger, part, local, data)
            pkg.files.append(SendFile(f"@run/{name}", folder / local, f.sha256))
        for remote in pkg.secrets:
            pkg.files.append(SendFile(f"@run/{remote}", None, None))
        pkg.secrets = {f"@run/{k}": v for k, v in pkg.secrets.items()}
        pkg.requirements = "@run/requirements.txt"
        packages.append(pkg)
    manifest = stamp(SCHEMA, 1, {
        **header,
        "hosts": [{"alias": p.alias, "roles": p.roles, "smoke": p.smoke,
                   "requirements": p.requirements,
                   "files": [f.as_json() for f in p.files]} for p in packages]})
    ledger.writer.create(part / "manifest.json", canonical_json(manifest).encode() + b"\n")
    try:
        os.replace(part, folder)
    except OSError:  # prepared at the same moment by another run: use that one
        shutil.rmtree(part, ignore_errors=True)


def changed_files(prepared: Prepared) -> list[str]:
    """Local files whose bytes no longer match the manifest (edited after preparing)."""
    changed = []
    for pkg in prepared.hosts:
        for f in pkg.files:
            if f.local is None or f.sha256 is None:
                continue
            try:
                ok = wheelhouse.file_sha256(f.local) == f.sha256
            except OSError:
                ok = False
            if not ok and str(f.local) not in changed:
                changed.append(str(f.local))
    return changed
