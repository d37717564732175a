"""The trial's client is open loop: every request leaves at its scheduled time however many are
in flight, so a fleet slower than the arrival rate is reported as a capacity miss, never as a
client that fell behind. A deliberately slow HTTP server on loopback holds each request longer
than the gap between arrivals; in flight grows past what a fixed cap of 32 would let through."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from narwhal.deploy.trial import client
from narwhal.deploy.trial.schedule import schedule
from narwhal.deploy.trial.verdict import MAX_LAG_S, MAX_LATE_SHARE, Record, summarise, verdict
from narwhal.lab.engine.testing import free_port

HOLD_S = 1.0  # each first token this late: a hundred arrival gaps at RATE
RATE, REQUESTS = 100.0, 150  # about 1.5 s of arrivals, about 100 in flight at the peak
OLD_CAP = 32  # the in-flight cap the client used to hold requests back at
# A streaming completion endpoint that is slow on purpose: reads one request, waits HOLD,
# streams three tokens and [DONE], closes. It ends itself after LIFE seconds whatever happens.
SLOW = """
import asyncio, sys
HOLD, PORT, LIFE = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
MODE = sys.argv[4] if len(sys.argv) > 4 else "whole"  # or "error" / "cut": a broken stream
async def answer(reader, writer):
    try:
        head = await reader.readuntil(b"\\r\\n\\r\\n")
        size = [int(h.split(b":")[1]) for h in head.split(b"\\r\\n")
                if h.lower().startswith(b"content-length:")]
        await reader.readexactly(size[0] if size else 0)
        await asyncio.sleep(HOLD)
        writer.write(b"HTTP/1.1 200 OK\\r\\nContent-Type: text/event-stream\\r\\n"
                     b"Connection: close\\r\\n\\r\\n")
        for n in range(3):
            writer.write(b'data: {"n": %d}\\n\\n' % n)
            await writer.drain()
            await asyncio.sleep(0.01)
        if MODE == "error":
            writer.write(b'data: {"error": {"message": "engine died", "code": "x"}}\\n\\n')
        if MODE != "cut":
            writer.write(b"data: [DONE]\\n\\n")
        await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()
async def main():
    server = await asyncio.start_server(answer, "127.0.0.1", PORT, backlog=1024)
    async with server:
        await asyncio.sleep(LIFE)
asyncio.run(main())
"""


@pytest.fixture
def slow_server() -> Iterator[str]:
    """The slow server's base URL; it is ended by its pid afterwards."""
    with _server(HOLD_S, "whole") as url:
        yield url


@contextlib.contextmanager
def _server(hold_s: float, mode: str) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SLOW, str(hold_s), str(port), "60", mode],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the slow server did not start"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _peak_in_flight(records: list[Record]) -> int:
    """The most requests sent and not yet answered at once, from the client's records."""
    edges = sorted([(r.sent_s, 1) for r in records] +
                   [(r.token_times_s[-1] if r.token_times_s else r.sent_s, -1)
                    for r in records])
    level, peak = 0, 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def test_a_server_slower_than_the_arrivals_is_a_capacity_miss_not_a_late_client(
        slow_server: str) -> None:
    planned = schedule(RATE, REQUESTS, 3, 8, 3, "open")
    sent = asyncio.run(client.run(slow_server, "m", planned, None, timeout_s=20.0))
    records = sent.records

    assert len(records) == REQUESTS and all(r.status == 200 and not r.error for r in records)
    assert _peak_in_flight(records) > 2 * OLD_CAP  # far past the old cap, all at once
    lags = sorted(r.lag_s for r in records)
    # every one left on time but for what a loaded two-core machine delays: never the
    # seconds a closed loop (the old cap of 32) made them wait
    assert sum(lag > MAX_LAG_S for lag in lags) <= MAX_LATE_SHARE * REQUESTS, lags[-5:]
    assert lags[-1] < 1.0, lags[-5:]
    assert all(r.ttft_s is not None and r.ttft_s >= HOLD_S * 0.9 for r in records)
    summary = summarise(RATE, records, sent.seconds, 0.5, 0.05)
    summary["client_cpu_share"] = round(sent.cpu_share, 3)
    assert summary["late_sends"] <= MAX_LATE_SHARE * REQUESTS and summary["client_limited"] == 0
    assert verdict(summary, True, True) == "capacity miss"
    assert sent.budget >= 1000  # the stated bound is large, and it is said


def test_a_budget_that_is_hit_is_counted_as_client_limited_not_capacity(
        slow_server: str) -> None:
    planned = schedule(RATE, 30, 3, 8, 3, "limited")
    sent = asyncio.run(client.run(slow_server, "m", planned, None, timeout_s=20.0, budget=10))

    assert sent.budget == 10 and _peak_in_flight(sent.records) <= 10
    summary = summarise(RATE, sent.records, sent.seconds, 0.5, 0.05)
    assert summary["client_limited"] == 20  # every request that found the budget full
    assert summary["late_sends"] == 0  # their lag is the budget's, counted there alone
    assert verdict(summary, True, True) == "client-limited"


@pytest.mark.parametrize(("mode", "said"), [("error", "stream broke: {\"error\""),
                                            ("cut", "stream ended without [DONE]")])
def test_a_stream_broken_after_its_200_is_a_failed_request_not_an_answer(
        mode: str, said: str) -> None:
    """A 200 whose stream ends in an error event or without [DONE] is what a router gives a
    client when an engine dies mid-answer: the trial counts it failed, naming how it broke."""
    planned = schedule(10.0, 3, 0, 4, 8, "b")
    with _server(0.0, mode) as base:
        sent = asyncio.run(client.run(base, "m", planned, None, timeout_s=20.0))
    assert [r.status for r in sent.records] == [200, 200, 200]
    assert all(r.error.startswith(said) for r in sent.records), [r.error for r in sent.records]
    assert summarise(10.0, sent.records, 1.0, 1.0, 1.0)["ok"] == 0
