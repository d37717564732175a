"""The live KV canary drill's parts (issue 41), for the lab fleet Gate G serves: client streams
through the router from its host, the emulator's corrupt_pulls fault on one consumer for one
producer, and what an operator reads there (the router's canary state, the lab Prometheus's
alerts, the journal). Every call goes from the workstation namespace to the router host."""

from __future__ import annotations

import json
import shlex
import threading
import time
from collections.abc import Callable
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

from tests.lab.installing import Installer

from narwhal.lab.testing import ssh

T = TypeVar("T")
# The end of every client script run on the router host: `clients` threads of `client()`.
RUN_CLIENTS = """threads = [threading.Thread(target=client) for _ in range(int(clients))]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""
# Run on the router host: streaming completions through the router (argv[1] its base URL, the
# tenant key read from the file argv[2], the model argv[3]) with request ids argv[4]-<n>,
# argv[5] of them or fewer once the file argv[6] exists, from argv[7] clients at once (each
# sends its next when its last ended), argv[8] tokens each. Each prompt starts with its own
# number, so no prefix cache makes it run whole. One line per request: [id, HTTP status (0: no
# answer), whether its stream ended with `data: [DONE]`].
STREAMS = """import itertools, json, os, sys, threading, urllib.error, urllib.request
base, key_file, model, prefix, count, stop, clients, tokens = sys.argv[1:9]
key = open(key_file).read().strip()
words = "the sea and the ships of the world sail on to the far land".split()
numbers, printing = itertools.count(), threading.Lock()
def client():
    for n in numbers:
        if n >= int(count) or os.path.exists(stop):
            return
        rid = f"{prefix}-{n}"
        prompt = f"request {n}: " + " ".join(words[(n + k) % len(words)] for k in range(200))
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": int(tokens),
                           "stream": True})
        req = urllib.request.Request(base + "/v1/completions", data=body.encode(), headers={
            "Content-Type": "application/json", "Authorization": "Bearer " + key,
            "x-request-id": rid})
        try:
            with urllib.request.urlopen(req, timeout=30) as reply:
                got = [rid, reply.status, reply.read().rstrip().endswith(b"data: [DONE]")]
        except urllib.error.HTTPError as e:
            got = [rid, e.code, False]
        except OSError:
            got = [rid, 0, False]
        with printing:
            print(json.dumps(got), flush=True)
""" + RUN_CLIENTS
SCRIPT = "/tmp/narwhal-canary-streams.py"
STOP = "/tmp/narwhal-canary-streams.stop"


def on_router(fleet: Installer, command: str, timeout: float = 30.0) -> str:
    done = ssh(fleet.op.plan, fleet.lab_host("router"), command, timeout=timeout)
    assert done.returncode == 0, (command[:200], done.stderr[-2000:])
    return str(done.stdout).strip()


def streams(fleet: Installer, base: str, prefix: str, count: int, clients: int,
            tokens: int) -> list[list[Any]]:
    """`count` streaming completions through the router from `clients` clients at once:
    [id, status, ended] each."""
    key = f"{fleet.secrets_dir()}/NARWHAL_ROUTER_API_KEY"
    argv = ["python3", SCRIPT, base, key, fleet.op.plan.spec.model.name, prefix, str(count),
            STOP, str(clients), str(tokens)]
    out = on_router(fleet, shlex.join(argv), timeout=120)
    return [json.loads(line) for line in out.splitlines()]


def put_script(fleet: Installer, path: str, text: str) -> None:
    """A client script at `path` on the router host."""
    done = ssh(fleet.op.plan, fleet.lab_host("router"), f"cat > {path} <<'PY'\n{text}PY")
    assert done.returncode == 0, done.stderr


def put_streams(fleet: Installer) -> None:
    """The client script on the router host, and no stop file left from an earlier run."""
    on_router(fleet, f"rm -f {STOP}")
    put_script(fleet, SCRIPT, STREAMS)


class Load:
    """Client streams through the router from three clients at once until the block ends:
    the canary probes only while the router serves (a request in flight or one ended since its
    last probe), and with several streams at once the router splits requests over the pairs."""

    def __init__(self, fleet: Installer, base: str, prefix: str) -> None:
        self.fleet, self.base, self.prefix = fleet, base, prefix
        self.sent: list[list[Any]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.sent = streams(self.fleet, self.base, self.prefix, 100_000, 3, 16)

    def __enter__(self) -> Load:
        put_streams(self.fleet)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        on_router(self.fleet, f"touch {STOP}")
        self._thread.join(60)


def canary_state(fleet: Installer, base: str) -> dict[str, Any]:
    """The primary router's `kv_canary` state, as `narwhal status` reads it."""
    state = json.loads(on_router(fleet, f"curl -s {base}/narwhal/state"))["kv_canary"]
    assert isinstance(state, dict), state
    return state


def corrupt_pulls(fleet: Installer, consumer_url: str, peer: str | None) -> dict[str, Any]:
    """Make the consumer engine decode the KV it pulls from `peer` as another request's (None:
    clear every fault); the engine's fault state after."""
    body = {"fault": "corrupt_pulls", "peer": peer} if peer else {"fault": "clear"}
    out = on_router(fleet, f"curl -s -X POST -H 'Content-Type: application/json' "
                           f"-d {shlex.quote(json.dumps(body))} {consumer_url}/emu/fault")
    faults: dict[str, Any] = json.loads(out)["faults"]
    return faults


def kv_pair_alerts(fleet: Installer, prometheus_url: str) -> list[dict[str, Any]]:
    """The NarwhalKvPairHeld alerts the lab Prometheus has active (pending or firing)."""
    doc = json.loads(on_router(fleet, f"curl -s {prometheus_url}/api/v1/alerts"))
    return [a for a in doc["data"]["alerts"] if a["labels"]["alertname"] == "NarwhalKvPairHeld"]


def rfc3339(text: str) -> float:
    """Prometheus's activeAt (nanoseconds, Z) as a Unix time."""
    head, _, frac = text.rstrip("Z").partition(".")
    base = datetime.fromisoformat(head + "+00:00").timestamp()
    return base + (float(f"0.{frac}") if frac else 0.0)


def journal_rows(fleet: Installer, journal: str, prefix: str) -> list[dict[str, Any]]:
    """The router journal's rows whose request id starts with `prefix`."""
    out = on_router(fleet, f"grep -F {shlex.quote(chr(34) + prefix)} {journal} || true")
    rows = [json.loads(line) for line in out.splitlines()]
    return [r for r in rows if str(r["request_id"]).startswith(prefix)]


def until(what: str, probe: Callable[[], T | None], timeout: float, every: float = 0.2) -> T:
    """probe()'s first truthy answer, asked every `every` s; AssertionError after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(every)
