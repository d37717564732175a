"""The prefill line: a curve-priced router sends an engine one prompt behind the one it runs.

One vLLM-faithful emulator prefills (0.3 s a prompt, whatever its length), one decodes. The
emulator, as vLLM, runs every prompt waiting at it in its next step and answers them together
when that step ends; the router holds the rest in its own line, so prompts sent together
answer one by one, and a prompt whose client leaves while it waits there is never sent.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from narwhal.lab.engine.testing import RunningEngine
from tests.component.serve.harness import Reply, Router, call
from tests.component.serve.test_curve_scheduling import at_once, journal_rows, pd_fleet

pytestmark = pytest.mark.timeout(150)
PREFILL_S = 0.3
BODY = {"model": "tiny", "prompt": "the sea and the ships", "max_tokens": 2}


@contextlib.contextmanager
def prefill_fleet(root: Path, ttft_s: float, **serving: Any
                  ) -> Iterator[tuple[Router, Path, RunningEngine]]:
    with pd_fleet(root, ((PREFILL_S, 0.005, 0.0), (0.001, 0.005, 0.0)),
                  {"ttft_s": ttft_s, "tpot_s": 0.5}, **serving) as (router, journal, engines):
        yield router, journal, engines[0]


@pytest.fixture
def lined(tmp_path: Path) -> Iterator[tuple[Router, Path, RunningEngine]]:
    with prefill_fleet(tmp_path, 5.0) as fleet:
        yield fleet


def prefill_engine_state(router: Router) -> dict[str, Any]:
    engines = call(router.port, "GET", "/narwhal/state").json()["engines"]
    return dict(next(e for e in engines if e["id"] == "p0"))


def requests_finished(engine: RunningEngine) -> float:
    """Requests the engine finished, whatever the reason (its vllm:request_success counter)."""
    text = call(engine.port, "GET", "/metrics").body.decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def test_prompts_sent_together_answer_one_by_one_not_in_one_batch(
        lined: tuple[Router, Path, RunningEngine]) -> None:
    """Four at once: the first runs, the second waits at the engine, the last two in the
    router. Sent all at once (the old path) the engine computed the last three in one 0.9 s
    step and answered them together; through the line each answers a prefill after the one
    before it. (The first two may still share a step when both reach an idle engine before
    its loop wakes, so only the later ones are held to it.)"""
    router, journal, _ = lined
    replies = at_once(router, BODY, 4)
    assert [r.status for r in replies] == [200] * 4
    rows = journal_rows(journal, 4)
    assert {r["outcome"] for r in rows} == {"ok"} and {r["prefill_engine"] for r in rows} == {"p0"}
    firsts = sorted(float(r["received_at"]) + r["ttft_s"] for r in rows)
    gaps = [b - a for a, b in itertools.pairwise(firsts)]
    assert gaps[1] >= PREFILL_S / 2 and gaps[2] >= PREFILL_S / 2, (gaps, rows)
    state = prefill_engine_state(router)
    assert state["prefill_sent"] == 0 and state["prefill_pending"] == 0 and \
        state["outstanding"] == 0, state


def test_a_client_that_leaves_while_its_prompt_waits_in_the_line_is_never_sent(
        lined: tuple[Router, Path, RunningEngine]) -> None:
    """Two clients take the engine (one running, one waiting there); a third sends its
    request, which waits in the router's line, and leaves. It is settled as gone before its
    prefill, the engine never computes it, and its booked prefill is taken back: the next
    request waits for nothing."""
    router, journal, p0 = lined
    before = requests_finished(p0)
    replies: list[Reply] = []
    threads = [threading.Thread(target=lambda: replies.append(
        call(router.port, "POST", "/v1/completions", BODY))) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    body = json.dumps(BODY).encode()
    with socket.create_connection(("127.0.0.1", router.port), timeout=10) as leaver:
        leaver.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                       b"application/json\r\nContent-Length: " + str(len(body)).encode()
                       + b"\r\n\r\n" + body)
        time.sleep(0.1)
    for t in threads:
        t.join(30)
    assert [r.status for r in replies] == [200, 200]
    rows = journal_rows(journal, 3)
    gone = [r for r in rows if r["outcome"] != "ok"]
    assert len(gone) == 1 and gone[0]["outcome"] == "client_gone", rows
    assert "before the prefill leg" in gone[0]["reason"], gone
    assert requests_finished(p0) - before == 2  # two prefill legs and nothing else...
    time.sleep(2 * PREFILL_S)  # ...even once the line would have reached it
    assert requests_finished(p0) - before == 2
    state = prefill_engine_state(router)
    assert state["prefill_pending"] == 0 and state["prefill_sent"] == 0, state
    t0 = time.monotonic()
    assert call(router.port, "POST", "/v1/completions", BODY).status == 200
    assert time.monotonic() - t0 < 2 * PREFILL_S + 0.5


def test_a_burst_whose_prompts_are_being_counted_is_admitted_as_the_queue_allows(
        tmp_path: Path) -> None:
    """Every prompt counted on the engine's /tokenize before its prefill leg: the prefill is
    booked on the queue at placement, at its estimated length, so requests placed while the
    first ones are still being counted see them. TTFT budget 0.8 s, 0.3 s a prefill: two fit
    (0.3, 0.6), a third would answer at 0.9. (Booked only once counted, all four saw an
    empty queue, and the last two answered at 0.9 and 1.2 s.)"""
    with prefill_fleet(tmp_path, 0.8, prompt_length="tokenize") as (router, journal, _):
        replies = at_once(router, BODY, 4)
        assert sorted(r.status for r in replies) == [200, 200, 429, 429], replies
        rows = journal_rows(journal, 4)
        ok = [r for r in rows if r["outcome"] == "ok"]
        assert len(ok) == 2 and all(r["ttft_s"] <= 0.8 for r in ok), rows
        assert all(r["prompt_tokens"] is not None for r in ok)  # counted before the leg
        state = prefill_engine_state(router)
        assert state["prefill_pending"] == 0 and state["prefill_sent"] == 0, state
