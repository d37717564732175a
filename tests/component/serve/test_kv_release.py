"""The KV a producer holds is freed within the handoff's deadline when its consumer dies or
its edge is cut mid-transfer, through the router to emulator processes.

The producer's own `vllm:kv_cache_usage_perc` is the witness: the emulator counts blocks held
for a remote reader there, as vLLM's one KV cache does. Without the router, the producer holds
them for its lease (`kv_lease_duration`, 30 s by default; 480 s of
VLLM_NIXL_ABORT_REQUEST_TIMEOUT in llm-d/llm-d#1138).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.component.serve.faulted_fleet import (
    PROMPT,
    STALL_FLOOR_S,
    Fleet,
    Stream,
    answer_text,
    journal_row,
    running,
)
from tests.component.serve.harness import call, journal_rows

pytestmark = pytest.mark.timeout(240)
HANDOFF_BUDGET_S = 0.5
# a warm pair's first-byte deadline: the budget, then the stall allowance (5 steps of the
# 0.1 s objective, floored at STALL_FLOOR_S)
DEADLINE_S = HANDOFF_BUDGET_S + STALL_FLOOR_S
LEASE_S = 30.0  # the emulator's kv_lease_duration, as vLLM's default
USAGE = "vllm:kv_cache_usage_perc{"
FETCHING = ("vllm:num_requests_kv_fetch_by_stage{", 'stage="in_progress"')
BODY = {"model": "tiny", "prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stream": True}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running(tmp_path_factory.mktemp("kv-release"),
                 {"handoff_budget_s": HANDOFF_BUDGET_S}) as fleet:
        yield fleet


@pytest.fixture
def warm(fleet: Fleet) -> Iterator[Fleet]:
    """A whole fleet whose producer has handed KV to every decode engine (a pair's first
    handoff makes its connection and waits as long as any first token may)."""
    fleet.heal()
    served: set[str] = set()
    for i in range(12):
        reply = call(fleet.port, "POST", "/v1/completions",
                     {**BODY, "stream": False, "max_tokens": 2}, {"x-request-id": f"warm-{i}"})
        assert reply.status == 200, reply.body
        served.add(journal_row(fleet, f"warm-{i}")["decode_engine"])
        if served == {"d0", "d1", "d2"}:
            break
    assert served == {"d0", "d1", "d2"}, served
    assert fleet.gauge("p0", USAGE) == 0.0
    yield fleet
    for name in ("d0", "d1", "d2"):
        if fleet.engines[name].alive():
            fleet.fault(name, "clear")
    fleet.heal()


def _reference(fleet: Fleet) -> str:
    stream = Stream(fleet.port, "/v1/completions", BODY, "reference")
    stream.read()
    stream.close()
    return answer_text(stream.events, False)


class Background:
    """A streamed request read in a thread (the router answers its head with the first
    byte, which a cut edge holds back)."""

    def __init__(self, fleet: Fleet, request_id: str) -> None:
        self.stream: Stream | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fleet.port, request_id))
        self.thread.start()

    def _run(self, port: int, request_id: str) -> None:
        try:
            self.stream = Stream(port, "/v1/completions", BODY, request_id)
            self.stream.read()
            self.stream.close()
        except BaseException as exc:  # reported by answered()
            self.error = exc

    def answered(self, reference: str) -> None:
        self.thread.join(timeout=20)
        assert self.error is None, self.error
        assert self.stream is not None
        events = self.stream.events
        assert events[-1] == "[DONE]"
        assert not any("error" in e for e in events[:-1]), events
        assert answer_text(events, False) == reference


def _cut_consumer(fleet: Fleet, request_id: str) -> tuple[Background, str, float]:
    """Every edge from the producer cut, one streamed request sent: the consumer it stuck
    on, with the other edges mended, and when the request was sent."""
    for name in ("d0", "d1", "d2"):
        fleet.fault(name, "cut_pulls")
    sent = time.monotonic()
    request = Background(fleet, request_id)
    stuck = None
    while stuck is None and time.monotonic() < sent + 2:
        stuck = fleet.running(*FETCHING)
    assert stuck is not None, "no consumer started pulling"
    for name in ("d0", "d1", "d2"):
        if name != stuck:
            fleet.fault(name, "clear")
    return request, stuck, sent


def _freed_at(fleet: Fleet, bound_s: float) -> tuple[float, float]:
    """When the producer's KV usage went back to zero (monotonic), and the most it held."""
    end = time.monotonic() + bound_s
    most = 0.0
    while time.monotonic() < end:
        usage = fleet.gauge("p0", USAGE)
        most = max(most, usage)
        if usage == 0.0 and most > 0.0:
            return time.monotonic(), most
        time.sleep(0.01)
    raise AssertionError(f"the producer still holds KV after {bound_s} s (most {most})")


def test_a_cut_edge_s_kv_is_read_by_another_consumer_within_the_handoff_deadline(
        warm: Fleet) -> None:
    reference = _reference(warm)
    request, stuck, sent = _cut_consumer(warm, "cut")
    freed, most = _freed_at(warm, 10.0)
    assert most > 0.0  # the producer held the prompt's blocks while the edge was cut
    # the stuck leg waited out its deadline (not the 60 s first-token timeout), and the
    # KV was read elsewhere at once
    assert DEADLINE_S * 0.8 < freed - sent < DEADLINE_S + 1.0, freed - sent
    assert freed - sent < LEASE_S / 10
    request.answered(reference)
    row = journal_row(warm, "cut")
    assert row["status"] == 200 and row["decode_attempts"] == 2
    assert row["decode_engine"] != stuck
    warm.fault(stuck, "clear")  # the edge comes back: the abandoned pull moves nothing more
    time.sleep(0.3)
    assert warm.gauge("p0", USAGE) == 0.0


def _others(fleet: Fleet, count: int, out: list[int]) -> Callable[[], None]:
    def send() -> None:
        for i in range(count):
            reply = call(fleet.port, "POST", "/v1/completions",
                         {**BODY, "stream": False, "max_tokens": 4}, {"x-request-id": f"other-{i}"})
            out.append(reply.status)
    return send


def test_a_consumer_killed_mid_transfer_frees_the_producer_s_kv_and_fails_no_request(
        warm: Fleet) -> None:
    reference = _reference(warm)
    request, stuck, _ = _cut_consumer(warm, "killed-mid-transfer")
    statuses: list[int] = []
    others = threading.Thread(target=_others(warm, 8, statuses))
    others.start()
    killed = time.monotonic()
    os.kill(warm.engines[stuck].pid, signal.SIGKILL)
    freed, _ = _freed_at(warm, 10.0)
    # the router sees the consumer's connection drop and hands the KV to another at once
    assert freed - killed < DEADLINE_S, freed - killed
    request.answered(reference)
    others.join(timeout=30)
    assert statuses == [200] * 8, statuses
    rows = [r for r in journal_rows(warm.journal) if r["request_id"].startswith("other-")]
    assert all(r["status"] == 200 for r in rows), rows
    row: dict[str, Any] = journal_row(warm, "killed-mid-transfer")
    assert row["status"] == 200 and row["decode_engine"] != stuck
