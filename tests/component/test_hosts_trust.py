"""`narwhal hosts trust` is a recorded activity: each alias with the key it pinned, and for
--replace the old key beside the new, against a real sshd whose host key changes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from narwhal.deploy.cli.main import main
from narwhal.deploy.ledger import Ledger
from tests.component.conftest import write_env
from tests.component.sshd import Sshd


def _fingerprint(sshd: Sshd) -> list[dict[str, str]]:
    """The sshd's host key as the record names it (its only key: ed25519)."""
    done = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", f"{sshd.host_key}.pub"],
                          capture_output=True, check=True)
    return [{"key_type": "ssh-ed25519", "fingerprint": done.stdout.decode().split()[1]}]


def _last_trust(ledger: Ledger) -> tuple[dict[str, Any], dict[str, dict[str, Any]], Path]:
    """The last trust attempt's verdict document, its hosts by alias, and its folder."""
    entry = ledger.load()["activities"]["trust"]
    folder = ledger.attempt_folder("trust", entry["last"])
    attempt = json.loads((folder / "attempt.json").read_text())
    record = json.loads((folder / "trust.json").read_text())
    assert record["schema"] == "narwhal.host-trust"
    assert attempt["artifacts"]["trust.json"] and attempt["artifacts"]["env.masked"]
    assert (folder / "trust.json").stat().st_mode & 0o777 == 0o600
    return attempt, {h["alias"]: h for h in record["hosts"]}, folder


def test_trust_records_each_pinned_key_and_a_replacement_names_old_and_new(
        sshd: Sshd, tmp_path: Path) -> None:
    env = write_env(tmp_path / ".env", sshd)
    runs = tmp_path / "runs"
    common = ["--env", str(env), "--runs", str(runs), "--ssh-config", "/dev/null"]
    ledger = Ledger(runs, "demo")
    old = _fingerprint(sshd)

    assert main(["hosts", "trust", "--yes", *common]) == 0
    attempt, hosts, _ = _last_trust(ledger)
    assert attempt["verdict"] == "passed" and set(hosts) == {"node-1", "node-2"}
    assert hosts["node-1"]["roles"] == ["engine-1", "router"]
    for host in hosts.values():
        assert (host["outcome"], host["pinned"], host["previous"]) == ("pinned", old, [])

    assert main(["hosts", "trust", "--yes", *common]) == 0
    assert {h["outcome"] for h in _last_trust(ledger)[1].values()} == {"kept"}

    sshd.rekey()
    new = _fingerprint(sshd)
    known_hosts = (runs / "demo" / "known_hosts").read_bytes()
    assert main(["hosts", "trust", "--yes", *common]) == 1
    attempt, hosts, _ = _last_trust(ledger)
    assert attempt["verdict"] == "blocked" and "host key changed" in attempt["cause"]
    for host in hosts.values():
        assert host["outcome"] == "refused"
        assert (host["pinned"], host["previous"], host["presented"]) == (old, old, new)
    assert (runs / "demo" / "known_hosts").read_bytes() == known_hosts  # nothing re-pinned

    assert main(["hosts", "trust", "--yes", "--replace", "node-1", "--replace", "node-2",
                 *common]) == 0
    attempt, hosts, _ = _last_trust(ledger)
    assert attempt["verdict"] == "passed"
    for host in hosts.values():
        assert (host["outcome"], host["previous"], host["pinned"]) == ("replaced", old, new)
    assert main(["hosts", "check", *common]) == 0  # the new pin is the one ssh now holds to
    trusts = ledger.load()["activities"]["trust"]["attempts"]
    assert len(trusts) == 4
