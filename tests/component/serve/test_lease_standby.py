"""Exactly one active router per fleet: a rival is refused, a standby waits for the lease.

Real router processes over mini engines on loopback. The standby must never place a request
while the primary lives, and must serve within 2 s of the primary's SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from narwhal.serve.router.control.lease import Claimant, FileLease
from tests.component.serve.conftest import Spawner
from tests.component.serve.harness import MODEL, SERVE, call, free_port, wait_http

pytestmark = pytest.mark.timeout(90)
BODY = {"model": MODEL, "prompt": "hello there", "max_tokens": 2}


def _decode_ids(spawn: Spawner) -> set[str]:
    return {c.get("x_request_id") or "" for e in spawn.engines for c in e.calls()}


def test_a_second_router_on_the_same_fleet_refuses_naming_the_holder(spawn: Spawner) -> None:
    _, _, primary = spawn.pd()
    assert primary.proc is not None
    rival = subprocess.run([str(SERVE), "--fleet", str(primary.fleet), "--port", str(free_port())],
                           capture_output=True, text=True, timeout=30)
    assert rival.returncode == 1
    err = rival.stderr
    assert primary.url in err and f"pid {primary.proc.pid}" in err and "on host" in err
    assert "holds the lease until" in err and "--standby-of" in err
    result = json.loads(rival.stdout.strip().splitlines()[-1].split(" ", 1)[1])
    assert result["ok"] is False and primary.url in result["error"]
    assert call(primary.port, "POST", "/v1/completions", BODY).status == 200  # primary unharmed


def test_standby_never_serves_while_the_primary_lives_and_takes_over_within_2s_of_sigkill(
        spawn: Spawner) -> None:
    _, _, primary = spawn.pd()
    standby = spawn.router_on(primary.fleet, "--standby-of", primary.url, wait_ready=False)
    deadline = time.monotonic() + 3.0  # three seconds of overlap, both processes alive
    refused = 0
    while time.monotonic() < deadline:
        reply = call(standby.port, "POST", "/v1/completions", BODY,
                     headers={"x-request-id": f"sb-{refused}"})
        assert reply.status == 503 and reply.json()["error"]["code"] == "not_leader", reply.body
        refused += 1
        assert call(primary.port, "POST", "/v1/completions", BODY).status == 200
        time.sleep(0.05)
    assert not any(rid.startswith("sb-") for rid in _decode_ids(spawn))  # no leg ever left it
    state = call(standby.port, "GET", "/narwhal/state").json()
    assert state["controller"]["role"] == "standby" and state["served"] == 0
    assert state["controller"]["handoffs_applied"] > 0
    assert call(standby.port, "GET", "/ready").status == 503

    assert primary.proc is not None
    os.kill(primary.proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    while True:
        reply = call(standby.port, "POST", "/v1/completions", BODY, timeout=5)
        if reply.status == 200:
            break
        assert reply.json()["error"]["code"] == "not_leader"
        assert time.monotonic() - killed < 5, "standby did not take over"
        time.sleep(0.02)
    took = time.monotonic() - killed
    print(f"standby took over {took:.2f} s after the primary was killed")
    assert took < 2.0, f"standby took {took:.2f} s to take over"
    controller = call(standby.port, "GET", "/narwhal/state").json()["controller"]
    assert controller["role"] == "primary" and controller["epoch"] == 2
    assert call(standby.port, "GET", "/ready").status == 200


def test_a_primary_that_stops_hands_the_lease_over_at_once(spawn: Spawner) -> None:
    _, _, primary = spawn.pd()
    standby = spawn.router_on(primary.fleet, "--standby-of", primary.url, wait_ready=False)
    assert primary.stop() == 0
    assert primary.result()["data"]["lease"]["epoch"] == 1
    wait_http(standby.port, "/ready", timeout=1.0)  # released, not expired: well under a ttl
    assert call(standby.port, "POST", "/v1/completions", BODY).status == 200


def test_a_primary_whose_lease_was_taken_while_it_was_paused_fences_itself(spawn: Spawner) -> None:
    _, _, primary = spawn.pd()
    assert primary.proc is not None
    settings_ttl = 1.0  # the fleet default
    os.kill(primary.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(settings_ttl + 0.3)
        lease = FileLease(primary.fleet.with_name(primary.fleet.name + ".lease"), settings_ttl)
        thief = lease.acquire(Claimant("thief", "http://127.0.0.1:1", 1, "elsewhere"))
        assert thief.epoch == 2
    finally:
        os.kill(primary.proc.pid, signal.SIGCONT)
    # Resumed, it answers a request not_leader until its renewal (overdue on waking) finds the
    # lease gone; then it answers shutting_down and stops listening. Which of these this
    # request meets is a race with that renewal; none of them serves it.
    try:
        reply = call(primary.port, "POST", "/v1/completions", BODY)
    except (ConnectionRefusedError, ConnectionResetError):  # RemoteDisconnected is a reset
        pass
    else:
        assert reply.status == 503
        assert reply.json()["error"]["code"] in ("not_leader", "shutting_down")
    assert primary.proc.wait(timeout=20) == 1
    primary.stop()
    assert "lost the controller lease" in primary.stderr and "fenced" in primary.stderr
