"""One reading of a sidecar's answer for the router and for `narwhal status`."""

from __future__ import annotations

import pytest

from narwhal.core.sidecar_answer import (
    REFUSAL_KINDS,
    Reading,
    RefusalKind,
    read_answer,
    refusal,
)

DIGEST = "sha256:" + "a" * 64


def test_the_router_and_status_read_an_answer_the_same_way() -> None:
    assert read_answer(200, {"digest": DIGEST, "compatibility_hash": "c1"}, DIGEST, "c1") == \
        Reading("", False)
    assert read_answer(200, {"digest": DIGEST}, DIGEST) == Reading("", False)  # no hash held
    assert "compatibility hash" in read_answer(200, {"digest": DIGEST, "compatibility_hash":
                                                     "c2"}, DIGEST, "c1").reason
    assert read_answer(503, {"kind": "layout_changed", "error": "layout changed: x"},
                       DIGEST).process_changed
    assert read_answer(503, {}, DIGEST) == Reading("the sidecar refuses without a reason", False)
    assert read_answer(200, ["not", "an", "object"], DIGEST).reason == \
        "the sidecar answered 200 without a JSON object"
    assert read_answer(503, {"error": "x" * 5000}, DIGEST).reason == "x" * 300  # bounded


@pytest.mark.parametrize(("kind", "changed"), [("process_changed", True), ("layout_changed", True),
                                               ("unreadable", False)])
def test_each_refusal_kind_the_sidecar_sends_is_read_by_its_kind_not_its_words(
        kind: RefusalKind, changed: bool) -> None:
    """The prose is for operators and may be reworded; only `kind` decides what changed."""
    assert kind in REFUSAL_KINDS
    body = refusal(kind, "reworded: nothing a prefix match would recognise", "engine-1", DIGEST)
    assert read_answer(503, body, DIGEST) == Reading(body["error"], changed)


@pytest.mark.parametrize("body", [
    {"error": "engine process changed: it started at 2"},  # a sidecar without kinds
    {"kind": "engine_on_fire", "error": "engine process changed: it started at 2"},
    {"kind": ["process_changed"], "error": "layout changed"},
])
def test_an_unknown_or_missing_kind_holds_the_engine_but_is_not_read_as_changed(
        body: dict[str, object]) -> None:
    """Not "changed" is the safe reading: `narwhal attest` then holds the engine to Gate C's
    capture and names a new capture itself, where a wrong "changed" sends the operator to
    recapture or restart an engine that may be fine. The engine stays held either way."""
    reading = read_answer(503, body, DIGEST)
    assert reading.reason and reading.process_changed is False


def test_a_refusal_keeps_the_prose_error_operators_read() -> None:
    assert refusal("unreadable", "engine not answering (timed out)", "engine-1", DIGEST) == {
        "kind": "unreadable", "error": "engine not answering (timed out)", "engine": "engine-1",
        "attested_digest": DIGEST}
