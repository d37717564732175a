"""The runbook's evidence names (its "Evidence and recovery index": runs/discovery/<run>/,
runs/access-<id>/, runs/deployment-env/<run>/, runs/load-trial-<id>/) lead to our folders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from narwhal.core.errors import GateBlocked
from narwhal.deploy.ledger import Ledger
from narwhal.deploy.package import prepared as prep
from narwhal.deploy.package.lock import Lock
from narwhal.deploy.package.rolefiles import RoleFiles


def _index(ledger: Ledger) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((ledger.root / "runbook-index.json").read_text())
    assert doc["schema"] == "narwhal.runbook-index"
    for folder in doc["names"].values():
        assert (ledger.root / folder).is_dir(), folder
    return doc


def _ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "runs", "demo").ensure()


def test_every_discovery_attempt_blocked_or_passed_is_named_discovery_run(
        tmp_path: Path) -> None:
    """The runbook's runs/discovery/<run>/ is each Gate A attempt, whatever its verdict."""
    ledger = _ledger(tmp_path)
    with pytest.raises(GateBlocked), ledger.attempt("discover", fingerprint={}, hosts={}) as a:
        a.block("a host is down")
    with ledger.attempt("discover", fingerprint={}, hosts={}) as b:
        pass
    assert _index(ledger)["names"] == {f"discovery/{a.id}": f"discover/{a.id}",
                                       f"discovery/{b.id}": f"discover/{b.id}"}
    assert (ledger.root / f"discover/{b.id}/attempt.json").exists()


def test_every_access_check_is_named_access_id(tmp_path: Path) -> None:
    """The runbook's runs/access-<id>/ is each `narwhal hosts check` attempt."""
    ledger = _ledger(tmp_path)
    with ledger.attempt("access", fingerprint={}, hosts={}) as first:
        pass
    assert _index(ledger)["names"] == {f"access-{first.id}": f"access/{first.id}"}


def test_a_prepared_run_is_named_deployment_env_run_at_its_own_folder(tmp_path: Path) -> None:
    """Gate B's prepared run is the real folder deployment-env/<run>/, and the index names it
    (and still names it when an identical run is prepared again and reused)."""
    ledger = _ledger(tmp_path)
    built = {name: prep.SendFile(name, tmp_path / f"{name.replace(':', '-')}.whl", "ab" * 32)
             for name in ("bundle", "narwhal:pure", "narwhal:compiled")}
    roles = {role: RoleFiles(role, f"ROLE={role}\n", {}, ()) for role in ("engine-1", "router")}

    def prepare() -> str:
        return prep.prepare(ledger, "demo", "0" * 40, Lock("cp311", "manylinux_x86_64", ()),
                            built, {"node-1": ["engine-1"], "router": ["router"]}, roles,
                            {"engine-1": b"{}\n"}, b"{}\n", {})

    run_id = prepare()
    assert prepare() == run_id
    names = _index(ledger)["names"]
    assert names == {f"deployment-env/{run_id}": f"deployment-env/{run_id}"}
    assert (ledger.root / names[f"deployment-env/{run_id}"] / "manifest.json").is_file()


def test_every_capacity_trial_is_named_load_trial_id_and_gate_g_is_not(
        tmp_path: Path) -> None:
    """runs/load-trial-<id>/ is the `load-trial` activity (`narwhal trial`), never Gate G."""
    ledger = _ledger(tmp_path)
    with ledger.attempt("serve", fingerprint={}, hosts={}) as served:
        pass
    with ledger.attempt("load-trial", fingerprint={}, hosts={}) as trial:
        pass
    names = _index(ledger)["names"]
    assert names == {f"load-trial-{trial.id}": f"load-trial/{trial.id}"}
    assert f"serve/{served.id}" not in names.values()
