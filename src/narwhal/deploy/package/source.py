"""The approved revision, taken from the workstation checkout: resolved, bundled, built.

The revision must name exactly one commit of the checkout by its full id (inputs refuse a
short id; a ref that moved cannot match a full id). The bundle holds that commit and its
history under one branch, `deploy`, and is verified before it is sent; the hosts clone it and
check HEAD. Narwhal's own wheels are built from a clean clone of the bundle (never from the
working tree, which may hold edits the revision does not): a pure one for every host and,
once per revision, the one with the router's compiled request path (mypyc) for the router.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from narwhal.core.errors import InputError, Problem

FIELD = "NARWHAL_DEPLOYMENT_REVISION"
BRANCH = "deploy"
BUILD_TIMEOUT_S = 900


def _git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True,
                          timeout=300, check=False)
    if check and done.returncode != 0:
        command = next(a for a in args if not a.startswith("-") and "=" not in a)
        raise InputError(str(cwd), [Problem(f"git {command}", done.stderr.strip()[:300] or
                                            f"exited {done.returncode}",
                                            "run from a Narwhal git checkout")])
    return done


def checkout_root(start: Path) -> Path:
    done = _git(start, "rev-parse", "--show-toplevel", check=False)
    if done.returncode != 0:
        raise InputError(str(start), [Problem("--checkout", f"{start} is not a git checkout",
                                              "run from the Narwhal checkout that holds the "
                                              "revision, or pass --checkout DIR")])
    return Path(done.stdout.strip())


def resolve(checkout: Path, revision: str) -> str:
    """The revision as the checkout knows it: present, a commit, and equal to itself."""
    done = _git(checkout, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}",
                check=False)
    found = done.stdout.strip()
    if done.returncode != 0 or not found:
        raise InputError(str(checkout), [Problem(FIELD, f"{revision} is not a commit in "
                                                 f"{checkout}", "fetch it into the checkout, "
                                                 "or set the revision you approved")])
    if found != revision:
        raise InputError(str(checkout), [Problem(FIELD, f"{revision} resolves to {found}",
                                                 "give the full commit id")])
    head = _git(checkout, "rev-parse", "HEAD").stdout.strip()
    if head == revision:
        dirty = _git(checkout, "status", "--porcelain", "--untracked-files=no").stdout
        if dirty.strip():
            first = dirty.splitlines()[0][3:]
            raise InputError(str(checkout), [Problem(
                FIELD, f"the checkout is at {revision[:12]} with uncommitted changes "
                f"({first}{' ...' if len(dirty.splitlines()) > 1 else ''}); the hosts would get "
                "the commit without them", "commit them and approve the new revision, or "
                "stash them")])
    return found


# One delta-search thread: with several, which deltas are found depends on how the threads
# are scheduled, so the same revision bundled twice on a loaded workstation differs.
_ONE_THREAD = ("-c", "pack.threads=1")


def make_bundle(checkout: Path, revision: str, out: Path) -> None:
    """A verified bundle of revision's history as branch `deploy` (the checkout is untouched).

    The same revision gives the same bytes on any workstation and any load: the hosts keep
    one bundle per revision and refuse a different file at that path, so a second
    workstation, or a fresh runs folder, must bundle exactly what the first sent. The fetched
    objects are repacked without the checkout's own deltas (they depend on how that clone
    was packed), on one thread."""
    out = out.resolve()  # git runs in the temporary repository
    with tempfile.TemporaryDirectory(prefix="narwhal-bundle-") as tmp:
        bare = Path(tmp) / "repo.git"
        subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True, timeout=60)
        _git(bare, *_ONE_THREAD, "fetch", "-q", "--no-tags", str(checkout.resolve()),
             f"{revision}:refs/heads/{BRANCH}")
        _git(bare, *_ONE_THREAD, "repack", "-q", "-a", "-d", "-F")
        _git(bare, *_ONE_THREAD, "bundle", "create", "-q", str(out), BRANCH)
        _git(bare, "bundle", "verify", "-q", str(out))


def build_wheel(bundle: Path, revision: str, out: Path, *, compiled: bool) -> Path:
    """narwhal-fleet's wheel built from a clean clone of the bundle; cached in `out`."""
    bundle, out = bundle.resolve(), out.resolve()
    existing = sorted(out.glob("narwhal_fleet-*.whl")) if out.is_dir() else []
    if len(existing) == 1:
        return existing[0]
    with tempfile.TemporaryDirectory(prefix="narwhal-build-") as tmp:
        clone = Path(tmp) / "src"
        subprocess.run(["git", "clone", "-q", "--branch", BRANCH, str(bundle), str(clone)],
                       check=True, capture_output=True, timeout=300)
        head = _git(clone, "rev-parse", "HEAD").stdout.strip()
        if head != revision:
            raise InputError(str(bundle), [Problem("bundle", f"HEAD is {head}, not {revision}",
                                                   "rerun `narwhal install`")])
        env = {k: v for k, v in os.environ.items() if k != "NARWHAL_PURE_PYTHON"}
        if not compiled:
            env["NARWHAL_PURE_PYTHON"] = "1"
        built = Path(tmp) / "wheel"
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                               "--no-build-isolation", "--no-index", "-w", str(built),
                               str(clone)], capture_output=True, text=True, env=env,
                              timeout=BUILD_TIMEOUT_S, check=False)
        wheels = sorted(built.glob("narwhal_fleet-*.whl"))
        if done.returncode != 0 or len(wheels) != 1:
            tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
            raise InputError(str(bundle), [Problem(
                "wheel", f"building narwhal-fleet ({'compiled' if compiled else 'pure'}) "
                f"failed: {tail}", "run `make setup` on the workstation (the build needs "
                "setuptools, mypy and a C compiler), then rerun")])
        out.mkdir(parents=True, exist_ok=True)
        part = out / (wheels[0].name + ".part")
        shutil.copyfile(wheels[0], part)
        os.replace(part, out / wheels[0].name)
        return out / wheels[0].name
