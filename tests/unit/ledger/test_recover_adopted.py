"""`narwhal recover` never ends a router (or Prometheus) a later attempt adopted: the service
that attempt serves with would go down for the sake of undoing an earlier, failed one."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from narwhal.deploy.gates.owned_processes import earlier_processes
from narwhal.deploy.gates.serve import record_adoptions
from narwhal.deploy.hosts.local import LocalHost
from narwhal.deploy.ledger.evidence import read_rows
from narwhal.deploy.ledger.recover import adopted_later, kept_because, recover
from tests.unit.ledger.records import ledger_for_valid_env

ROUTER = {"kind": "process", "host": "router", "pid": 4242, "start_ticks": 777,
          "argv0": "/opt/narwhal/bin/narwhal-serve", "serves": "router"}


def test_a_process_a_later_attempt_adopted_is_kept_naming_that_attempt() -> None:
    adopted = {("router", 4242, 777): "002-x"}
    said = kept_because(ROUTER, "serve", adopted)
    assert said.startswith("kept: adopted by the later attempt serve/002-x"), said
    # the same pid with another start time is another process: recovery goes on as before
    assert kept_because({**ROUTER, "start_ticks": 778}, "serve", adopted) == ""
    assert kept_because({**ROUTER, "host": "node-1"}, "serve", adopted) == ""
    assert kept_because(ROUTER, "serve", {}) == ""
    assert kept_because({"kind": "file", "host": "router", "path": "/x"}, "serve", adopted) == ""


def test_an_adopted_row_is_never_ended_by_the_adopters_own_recovery() -> None:
    row = {**ROUTER, "kind": "adopted", "started_by": "serve/001-x"}
    assert kept_because(row, "serve", {}).startswith(
        "kept: adopted from serve/001-x, not created by this attempt")


def test_adoptions_are_read_from_the_attempts_after_the_one_recovered() -> None:
    rows = {"001": [ROUTER], "002": [{**ROUTER, "kind": "adopted"}],
            "003": [{**ROUTER, "kind": "adopted", "pid": 5, "start_ticks": 6}]}
    assert adopted_later(rows, ["001", "002", "003"], "001") == {
        ("router", 4242, 777): "002", ("router", 5, 6): "003"}
    assert adopted_later(rows, ["001", "002", "003"], "002") == {("router", 5, 6): "003"}
    assert adopted_later(rows, ["001", "002", "003"], "003") == {}


def test_recovering_a_failed_serve_keeps_the_router_a_later_attempt_adopted(
        tmp_path: Path) -> None:
    ledger, host = ledger_for_valid_env(tmp_path), LocalHost("router")
    with pytest.raises(RuntimeError), ledger.attempt("serve", fingerprint={},
                                                     hosts={}) as first:
        ref = first.start_process(host, ["sleep", "120"], str(tmp_path / "router.log"),
                                  serves="router")
        raise RuntimeError("Prometheus exited")
    try:
        with pytest.raises(RuntimeError), ledger.attempt("serve", fingerprint={},
                                                         hosts={}) as second:
            # Gate G's own step: the router answering as primary says its pid; it adopts it
            ours = earlier_processes(ledger, "serve", second.id, "sleep")
            record_adoptions(second, ours, {ref.pid, None})
            raise RuntimeError("dashboard panels without data")  # it fails later, too
        (adoption,) = read_rows(second.folder / "owned.jsonl")
        assert (adoption["kind"], adoption["pid"], adoption["started_by"]) == (
            "adopted", ref.pid, f"serve/{first.id}")

        report = recover(ledger, "serve", lambda alias: host, attempt_id=first.id)

        (row,) = report
        assert row["result"].startswith(f"kept: adopted by the later attempt serve/{second.id}")
        assert host.process_start(ref.pid) == ref.start_ticks  # still serving
        # and the adopter's own recovery keeps it as well: it did not create it
        (again,) = recover(ledger, "serve", lambda alias: host)  # the last attempt
        assert again["result"] == f"kept: adopted from serve/{first.id}, not created by this " \
                                  "attempt"
        assert host.process_start(ref.pid) == ref.start_ticks
    finally:
        if host.process_start(ref.pid) == ref.start_ticks:
            os.kill(ref.pid, signal.SIGKILL)
