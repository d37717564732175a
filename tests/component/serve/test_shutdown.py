"""SIGTERM: stop accepting, finish what is in flight (bounded), flush the journal, report."""

from __future__ import annotations

import signal
import socket
import threading
import time

import pytest

from tests.component.serve.conftest import Spawner
from tests.component.serve.harness import MODEL, Reply, call, journal_rows

pytestmark = pytest.mark.timeout(120)
SLOW = {"model": MODEL, "prompt": "slow stream", "max_tokens": 20, "stream": True}


def _streams(port: int, n: int) -> tuple[list[threading.Thread], list[Reply]]:
    replies: list[Reply] = []

    def one(k: int) -> None:
        replies.append(call(port, "POST", "/v1/completions", SLOW, {"x-request-id": f"drain-{k}"}))

    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    return threads, replies


def _wait_inflight(port: int, n: int) -> None:
    deadline = time.monotonic() + 10
    while call(port, "GET", "/narwhal/state").json()["inflight"] < n:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_sigterm_drains_in_flight_streams_and_flushes_the_journal(spawn: Spawner) -> None:
    p = spawn.engine("p0")
    d = spawn.engine("d0", "--token-gap-ms", "40")
    r = spawn.router([("p0", p.url, "prefill"), ("d0", d.url, "decode")])
    threads, replies = _streams(r.port, 3)
    _wait_inflight(r.port, 3)
    assert r.proc is not None
    r.proc.send_signal(15)
    time.sleep(0.3)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", r.port), timeout=1).close()
    for t in threads:
        t.join(timeout=30)
    assert r.stop() == 0
    assert sorted(reply.status for reply in replies) == [200, 200, 200]
    assert all(reply.events()[-1] == "[DONE]" for reply in replies)
    result = r.result()["data"]
    assert result["inflight_at_stop"] == 3
    assert result["cut_at_drain_timeout"] == 0
    assert result["journal_rows"] == 3
    rows = journal_rows(spawn.journal)
    assert sorted(row["request_id"] for row in rows) == ["drain-0", "drain-1", "drain-2"]
    assert all(row["outcome"] == "ok" for row in rows)


def test_requests_that_outlive_the_drain_bound_are_cut_and_still_journaled(
        spawn: Spawner) -> None:
    p = spawn.engine("p0")
    d = spawn.engine("d0", "--token-gap-ms", "500")
    r = spawn.router([("p0", p.url, "prefill"), ("d0", d.url, "decode")],
                     serving={"drain_timeout_s": 0.5})
    threads, replies = _streams(r.port, 2)
    _wait_inflight(r.port, 2)
    time.sleep(0.2)  # let the streams start
    t0 = time.monotonic()
    assert r.stop() == 0
    assert time.monotonic() - t0 < 8
    for t in threads:
        t.join(timeout=30)
    assert len(replies) == 2
    for reply in replies:
        events = reply.events()
        assert events[-2]["error"]["code"] == "router_shutdown"  # told, not just hung up on
        assert events[-1] == "[DONE]"
    result = r.result()["data"]
    assert result["cut_at_drain_timeout"] == 2
    rows = journal_rows(spawn.journal)
    assert sorted(row["outcome"] for row in rows) == ["cut_at_shutdown", "cut_at_shutdown"]


def test_stop_signals_that_keep_coming_while_it_exits_never_kill_it(spawn: Spawner) -> None:
    """A supervisor that repeats SIGTERM, or an operator who presses Ctrl-C again, while the
    router drains and exits: every signal after the first finds the shutdown under way, so
    the router still exits 0 with its result line and its journal, never by the signal.
    (Once its handlers were gone, a signal in its last milliseconds killed it: -15.)"""
    p = spawn.engine("p0")
    d = spawn.engine("d0")
    r = spawn.router([("p0", p.url, "prefill"), ("d0", d.url, "decode")])
    body = {"model": MODEL, "prompt": "one", "max_tokens": 2}
    assert call(r.port, "POST", "/v1/completions", body).status == 200
    assert r.proc is not None
    deadline = time.monotonic() + 20
    sent = 0
    while r.proc.poll() is None and time.monotonic() < deadline:
        r.proc.send_signal(signal.SIGTERM if sent % 2 == 0 else signal.SIGINT)
        sent += 1
        time.sleep(0.001)
    assert r.stop() == 0, (sent, r.stderr)
    assert sent > 1
    assert r.result()["data"]["journal_rows"] == 1
