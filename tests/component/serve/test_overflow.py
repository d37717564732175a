"""Overflow under the pool planner: two kv_both emulators, one per pool (the floors keep them
there), with the same timing as test_role_flips.py (a 1600-token prefill 0.36 s, a decode
step 5 ms + 8 ms a stream; TTFT budget 1.0 s, TPOT 0.05 s).

- Four clients of 1600-token prompts (64 tokens each) keep the lone prefill engine busy (two
  prefills fit the budget there, 0.72 s): the requests that would wait past the budget run
  whole on the decode engine instead of being refused. The prefill engine's legs keep a
  stream or two decoding there all the time (its prefill line sends them one by one), so
  the streams are long enough to absorb an overflow prefill within their TPOT budget.
- Eight clients of 60-token streams need a step of 5 + 8 x 8 ms on the lone decode engine,
  over the budget: the streams it cannot take decode on the prefill engine, which has no
  prefill to share its steps with.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.component.serve.harness import Router, call, journal_rows
from tests.component.serve.test_generation_binding import wait_for
from tests.component.serve.test_role_flips import emulator_fleet

pytestmark = pytest.mark.timeout(120)
NAMES = ("b0", "b1")
PLANNER = {"mode": "planner", "interval_s": 0.2, "window_s": 1.0, "cooldown_s": 1.0,
           "min_prefill": 1, "min_decode": 1}
LONG = {"model": "tiny", "prompt": "sea " * 400, "max_tokens": 64}
STREAM = {"model": "tiny", "prompt": "the sea", "max_tokens": 60, "stream": True}


def drive(router: Router, body: dict[str, Any], clients: int, until: Callable[[], bool],
          limit_s: float) -> list[int]:
    """Keep `clients` requests going until `until()` holds or `limit_s` passes; every prompt
    gets its own head, so the engines' prefix caches cannot shorten a prefill."""
    statuses: list[int] = []
    stop = threading.Event()
    deadline = time.monotonic() + limit_s

    def client(c: int) -> None:
        for k in range(400):
            if stop.is_set() or time.monotonic() > deadline:
                return
            unique = {**body, "prompt": f"{c}-{k} {body['prompt']}"}
            status = call(router.port, "POST", "/v1/completions", unique, timeout=30).status
            statuses.append(status)
            if status == 429:
                time.sleep(0.05)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    try:
        while not until() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join(40)
    return statuses


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Router]:
    with emulator_fleet(tmp_path, NAMES, PLANNER) as router:
        wait_for("every engine bound to its profile", lambda: all(
            e["admitted"] for e in call(router.port, "GET", "/narwhal/state").json()["engines"]))
        yield router


def overflow(router: Router) -> dict[str, int]:
    return dict(call(router.port, "GET", "/narwhal/state").json()["scheduler"]["overflow"])


def test_requests_one_pool_cannot_take_in_time_run_whole_on_the_other(
        fleet: Router, tmp_path: Path) -> None:
    router = fleet
    state = call(router.port, "GET", "/narwhal/state").json()
    assert {e["id"]: e["current_role"] for e in state["engines"]} == \
        {"b0": "prefill", "b1": "decode"}

    # one request first: its prefill reply teaches the router the prompt's token count per
    # byte, so the burst is priced at its real length (token_estimate.py)
    assert call(router.port, "POST", "/v1/completions", LONG, timeout=30).status == 200
    statuses = drive(router, LONG, clients=4,
                        until=lambda: overflow(router)["to_decode_pool"] >= 3, limit_s=8.0)
    assert overflow(router)["to_decode_pool"] >= 3, statuses
    assert set(statuses) <= {200, 429}

    statuses = drive(router, STREAM, clients=8,
                        until=lambda: overflow(router)["to_prefill_pool"] >= 3, limit_s=8.0)
    assert overflow(router)["to_prefill_pool"] >= 3, statuses
    assert set(statuses) <= {200, 429}

    router.stop()
    rows = journal_rows(tmp_path / "journal.jsonl")
    whole = [r for r in rows if r["mode"] == "single"]
    on_decode = [r for r in whole if r["decode_engine"] == "b1"]
    on_prefill = [r for r in whole if r["decode_engine"] == "b0"]
    assert len(on_decode) >= 3 and len(on_prefill) >= 3
    # one plain request on the engine of the other pool, served within the TTFT budget
    assert all(r["prefill_engine"] == r["decode_engine"] for r in whole)
    assert all(r["outcome"] == "ok" and r["ttft_s"] < 1.0 for r in on_decode), [(r["request_id"], r["ttft_s"], r["outcome"], r["prompt_tokens"], r["total_s"]) for r in on_decode]
    assert all(r["outcome"] == "ok" and r["events"] >= 60 for r in on_prefill)
