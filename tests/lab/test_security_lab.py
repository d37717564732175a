"""Credentials end to end on the lab: a `.env` with NARWHAL_ROUTER_API_KEY and NARWHAL_ENGINE_KEY
deployed A to G by `narwhal deploy`, then tried from the router host as a client would.

The router refuses a request without the tenant key (401) and serves one with it; an engine
reached straight from the router host refuses its /v1 routes without the engine key and
serves them with it; no key is in any process's argv on any lab host, in any file of the
record, or in any log on the hosts. The calls that send a key read it on the host from the
file Gate B placed there, so the test itself puts no key in an argv either.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.lab.fleet_up import clear_containers, stop_sidecars
from tests.lab.installing import Installer

from narwhal.lab.testing import ssh

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1200)]

# Run on a lab host: POST one completion to argv[1], with the bearer key read from the file
# argv[2] ("-" for none); print the HTTP status.
CALL = """import json, sys, urllib.error, urllib.request
url, key_file, model = sys.argv[1:4]
headers = {"Content-Type": "application/json"}
if key_file != "-":
    headers["Authorization"] = "Bearer " + open(key_file).read().strip()
body = json.dumps({"model": model, "prompt": "the sea", "max_tokens": 2}).encode()
try:
    print(urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers),
                                 timeout=30).status)
except urllib.error.HTTPError as e:
    print(e.code)
"""
# Run on a lab host: every file under argv[2:] (secrets/ folders left out) that holds a key
# read from the files under argv[1]; one path per line.
SCAN = """import os, sys
keys = set()
for base, _, names in os.walk(sys.argv[1]):
    for n in names:
        keys.add(open(os.path.join(base, n), "rb").read().strip())
keys.discard(b"")
for root in sys.argv[2:]:
    for base, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "secrets"]
        for n in names:
            p = os.path.join(base, n)
            try:
                data = open(p, "rb").read()
            except OSError:
                continue
            if any(k in data for k in keys):
                print(p)
"""


@dataclass
class Keyed:
    installer: Installer
    env: Path
    router_key: str
    engine_key: str
    secrets_dir: dict[str, str]  # lab host -> the prepared run's secrets folder there

    def on(self, host: str, command: str) -> str:
        done = ssh(self.installer.op.plan, host, command, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()


def _put_scripts(installer: Installer, host: str) -> None:
    for name, text in (("narwhal-call.py", CALL), ("narwhal-scan.py", SCAN)):
        done = ssh(installer.op.plan, host, f"cat > /tmp/{name} <<'PY'\n{text}PY")
        assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def keyed(installer: Installer) -> Iterator[Keyed]:
    router_key, engine_key = secrets.token_hex(24), secrets.token_hex(24)
    env = installer.op.variant("keyed", NARWHAL_ROUTER_API_KEY=router_key,
                               NARWHAL_ENGINE_KEY=engine_key)
    clear_containers(installer.op.plan)
    try:
        code, doc = installer.op.json_command(
            "deploy", "--checkout", str(installer.checkout), "--wheelhouse",
            str(installer.wheels), env=env)
        assert code == 0 and doc["verdict"] == "passed", doc
        plan = json.loads((installer.op.last_attempt("install") / "plan.json").read_text())
        run = f"{installer.remote}/runs/{plan['prepared_run']}/secrets"
        hosts = [installer.lab_host(a) for a in ("router", "engine-1", "engine-2", "engine-3")]
        for host in set(hosts):
            _put_scripts(installer, host)
        yield Keyed(installer, env, router_key, engine_key, {h: run for h in hosts})
    finally:
        stop_sidecars(installer)
        clear_containers(installer.op.plan)


def _call(k: Keyed, host: str, url: str, key_file: str) -> int:
    model = k.installer.op.plan.spec.model.name
    return int(k.on(host, f"python3 /tmp/narwhal-call.py {url} {key_file} {model}"))


def test_setting_the_keys_made_every_gate_run_again(keyed: Keyed) -> None:
    """The credentials are an input of Gate A (its launch records and fleet change with them),
    so deploy ran A to G rather than keeping a fleet that authenticates nobody."""
    ledger = json.loads((keyed.installer.op.runs / "lab" / "ledger.json").read_text())
    serve = keyed.installer.op.last_attempt("serve")
    fleet = json.loads((keyed.installer.op.last_attempt("preflight") /
                        "fleet-calibrated.json").read_text())
    assert fleet["tenants"] == [{"name": "default",
                                 "key_file": "../secrets/NARWHAL_ROUTER_API_KEY"}]
    assert fleet["engine_auth"] == {"key_file": "../secrets/NARWHAL_ENGINE_KEY"}
    assert ledger["gates"]["serve"]["state"] == "passed" and serve.exists()


def test_the_router_serves_only_requests_with_the_tenant_key(keyed: Keyed) -> None:
    router = keyed.installer.lab_host("router")
    url = "http://127.0.0.1:8000/v1/completions"
    secrets_dir = keyed.secrets_dir[router]
    assert _call(keyed, router, url, "-") == 401
    assert _call(keyed, router, url, f"{secrets_dir}/NARWHAL_ENGINE_KEY") == 401
    assert _call(keyed, router, url, f"{secrets_dir}/NARWHAL_ROUTER_API_KEY") == 200


def test_an_engine_reached_from_the_router_host_needs_the_engine_key(keyed: Keyed) -> None:
    router = keyed.installer.lab_host("router")
    record = json.loads((keyed.installer.op.last_attempt("discover") / "launch-engine-1.json")
                        .read_text())
    url = f"http://{record['fabric_address']}:{record['ports']['engine']}/v1/completions"
    secrets_dir = keyed.secrets_dir[router]
    assert _call(keyed, router, url, "-") == 401
    assert _call(keyed, router, url, f"{secrets_dir}/NARWHAL_ROUTER_API_KEY") == 401
    assert _call(keyed, router, url, f"{secrets_dir}/NARWHAL_ENGINE_KEY") == 200


def test_no_key_is_in_any_argv_record_or_host_log(keyed: Keyed) -> None:
    keys = (keyed.router_key.encode(), keyed.engine_key.encode())
    plan = keyed.installer.op.plan
    for host in sorted(set(keyed.secrets_dir)):
        argvs = ssh(plan, host, "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; "
                    "done 2>/dev/null", timeout=60).stdout.encode()
        assert argvs and not any(k in argvs for k in keys), host
        found = keyed.on(host, f"python3 /tmp/narwhal-scan.py {keyed.secrets_dir[host]} "
                         f"{keyed.installer.remote} {plan.spec.run_dir} /tmp")
        assert not found, (host, found.splitlines()[:10])
        mode = keyed.on(host, f"stat -c %a {keyed.secrets_dir[host]}/NARWHAL_ENGINE_KEY")
        assert mode == "600", (host, mode)
    leaked = [p for p in (keyed.installer.op.runs / "lab").rglob("*")
              if p.is_file() and any(k in p.read_bytes() for k in keys)]
    assert not leaked, leaked[:10]
    local = subprocess.run(["sh", "-c", "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' "
                            "< $f; echo; done 2>/dev/null"], capture_output=True, check=False)
    assert not any(k in local.stdout for k in keys)
