"""Bookings as data: each leg's event moves one engine's load, and a request's end takes back
exactly what it still holds."""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from narwhal.serve.router.request.relay import DecodeRelay
from narwhal.serve.router.scheduling.bookings import Bookings
from narwhal.serve.router.scheduling.engines import Engine, EngineLoad, Placement
from tests.unit.serve.test_scheduler import engine

SERVE = Path(__file__).resolve().parents[3] / "src" / "narwhal" / "serve"
LOAD_FIELDS = {f.name for f in fields(EngineLoad)}


@dataclass(eq=False)
class Request:
    price_tokens: int = 1000
    max_tokens: int | None = 64
    placement: Placement | None = None
    t0: float = 1.0
    tpot_s: float | None = None


def relay() -> DecodeRelay:
    return DecodeRelay(lambda _relay: None, 1.0, 1.0)


def idle(e: Engine) -> bool:
    """Nothing booked: the state a fresh engine starts in."""
    load = e.load
    return (load.prefill_pending == 0 and load.prefill_queued_s == 0.0 and load.running == 0
            and load.reserved == 0 and load.resident_tokens == 0 and load.reserved_tokens == 0
            and load.whole_reserved == 0 and not load.lives and not load.coming)


def split_request(bookings: Bookings, p0: Engine, d0: Engine, **kw: object) -> Request:
    request = Request(**kw)  # type: ignore[arg-type]
    request.placement = Placement(p0, d0)
    bookings.placed(request, request.placement)
    return request


def test_a_split_request_moves_from_reserved_to_running_and_leaves_nothing_behind() -> None:
    p0, d0 = engine("p0", "prefill"), engine("d0", "decode")
    bookings = Bookings()
    request = split_request(bookings, p0, d0)
    assert (d0.load.reserved, d0.load.reserved_tokens) == (1, 1000 + 32)
    assert d0.load.reserved_arrivals == pytest.approx(1 / 64)
    bookings.prefill_queued(request, p0)
    assert p0.load.prefill_pending == 1 and p0.load.prefill_queued_s > 0.0
    bookings.prefill_sent(request, p0)
    assert (p0.outstanding, p0.prefill_sent) == (1, 1)
    bookings.prefill_answered(request, p0)
    assert idle(p0) and (p0.outstanding, p0.prefill_sent) == (0, 0)
    bookings.decode_started(request, d0, relay(), split=True)
    assert (d0.load.reserved, d0.load.running, d0.load.resident_tokens) == (0, 1, 1032)
    assert d0.outstanding == 1
    bookings.decode_ended(request, d0)
    assert d0.load.running == 1  # the stream stays booked until the request ends
    assert d0.outstanding == 0  # but its leg is no longer out
    bookings.finished(request)
    assert idle(d0) and d0.load.departures == 1.0 and len(bookings) == 0


def test_a_prefill_booked_while_counting_is_repriced_not_booked_twice() -> None:
    p0, d0 = engine("p0", "prefill"), engine("d0", "decode")
    bookings = Bookings()
    request = split_request(bookings, p0, d0, price_tokens=4000)
    bookings.counting(request)
    estimated = p0.load.prefill_queued_s
    request.price_tokens = 1000  # /tokenize counted fewer
    bookings.prefill_queued(request, p0)
    assert p0.load.prefill_pending == 1
    assert p0.load.prefill_queued_s == pytest.approx(
        estimated - (p0.profile.prefill.seconds(4000) - p0.profile.prefill.seconds(1000)))


def test_a_request_that_ends_before_its_prefill_is_sent_takes_the_booking_back() -> None:
    p0, d0 = engine("p0", "prefill"), engine("d0", "decode")
    bookings = Bookings()
    first = split_request(bookings, p0, d0)
    bookings.prefill_queued(first, p0)
    bookings.prefill_sent(first, p0)
    waiting = split_request(bookings, p0, d0)
    bookings.prefill_queued(waiting, p0)  # in the router's line, not sent
    busy = p0.load.busy_until
    bookings.finished(waiting)
    assert p0.load.prefill_pending == 1
    assert p0.load.busy_until == pytest.approx(busy - p0.profile.prefill.seconds(1000))
    assert d0.load.reserved == 1  # only the first request's stream is left
    bookings.finished(first)  # sent: its prefill ends with the engine's answer, not here
    assert p0.load.prefill_pending == 1


def test_a_plain_request_books_its_prefill_with_its_decode_leg() -> None:
    b0 = engine("b0", "both")
    bookings = Bookings()
    request = Request()
    request.placement = Placement(b0, b0)
    bookings.placed(request, request.placement)
    assert b0.load.whole_reserved == 1 and b0.load.prefill_pending == 0
    bookings.decode_started(request, b0, relay(), split=False)
    assert b0.load.prefill_pending == 1 and b0.load.running == 1
    assert b0.load.arrival_rate == 0.0  # no KV lands: its prompt is on the queue instead
    bookings.decode_ended(request, b0)
    assert b0.load.prefill_pending == 0
    bookings.finished(request)
    assert idle(b0)


def test_a_decode_retry_moves_the_stream_and_the_same_leg_again_books_nothing_new() -> None:
    p0, d0, d1 = engine("p0", "prefill"), engine("d0", "decode"), engine("d1", "decode")
    bookings = Bookings()
    request = split_request(bookings, p0, d0)
    bookings.decode_started(request, d0, relay(), split=True)
    bookings.decode_started(request, d0, relay(), split=True)  # sent again on a fresh socket
    assert d0.load.running == 1
    bookings.decode_ended(request, d0)
    bookings.decode_started(request, d1, relay(), split=True)
    assert d0.load.running == 0 and d1.load.running == 1
    bookings.finished(request)
    bookings.finished(request)  # a second end changes nothing
    assert idle(d0) and idle(d1)


def test_a_request_never_placed_ends_without_touching_any_engine() -> None:
    p0 = engine("p0", "prefill")
    Bookings().finished(Request())
    assert idle(p0) and p0.load.busy_until == 0.0 and math.isinf(p0.load.waiting_since)


def test_the_handoff_and_the_tpot_bias_are_moving_averages_on_the_engine() -> None:
    d0 = engine("d0", "decode")
    bookings = Bookings()
    bookings.handoff(d0, 0.04)
    bookings.handoff(d0, 0.14)
    assert d0.load.handoff_s == pytest.approx(0.05)
    bookings.tpot_seen(d0, 0.008)
    assert d0.load.tpot_error_s == pytest.approx(0.001)


def _through_load(target: ast.expr) -> bool:
    """Does an assignment target reach into a load: `<x>.load.<field>`, `<x>.load`, or a
    field of a name bound to one (`load.<field>`)?"""
    if not isinstance(target, ast.Attribute):
        return False
    owner = target.value
    if target.attr in {"load", "outstanding", "prefill_sent"}:  # the engine's leg counters too
        return True
    if isinstance(owner, ast.Name):
        return owner.id == "load" and target.attr in LOAD_FIELDS
    return isinstance(owner, ast.Attribute) and owner.attr == "load"


def _load_writes(path: Path) -> list[str]:
    """Assignments in `path` into an engine's load."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.expr) and _through_load(part):
                    found.append(f"{path.name}:{node.lineno} {ast.unparse(target)}")
    return found


def test_only_bookings_write_an_engine_s_load() -> None:
    """The booking state has one owner: no other module of the router writes it (engines.py
    creates it)."""
    writers = [w for path in sorted(SERVE.rglob("*.py"))
               if path.name not in {"bookings.py", "engines.py"}
               for w in _load_writes(path)]
    assert writers == []
    # the check sees a write where one is
    assert _load_writes(SERVE / "router" / "scheduling" / "bookings.py")
