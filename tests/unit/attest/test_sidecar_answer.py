"""One reading of a sidecar's answer for the router and for `narwhal status`."""

from __future__ import annotations

from narwhal.core.sidecar_answer import Reading, read_answer

DIGEST = "sha256:" + "a" * 64


def test_the_router_and_status_read_an_answer_the_same_way() -> None:
    assert read_answer(200, {"digest": DIGEST, "compatibility_hash": "c1"}, DIGEST, "c1") == \
        Reading("", False)
    assert read_answer(200, {"digest": DIGEST}, DIGEST) == Reading("", False)  # no hash held
    assert "compatibility hash" in read_answer(200, {"digest": DIGEST, "compatibility_hash":
                                                     "c2"}, DIGEST, "c1").reason
    assert read_answer(503, {"error": "layout changed: x"}, DIGEST).process_changed
    assert read_answer(503, {}, DIGEST) == Reading("the sidecar refuses without a reason", False)
    assert read_answer(200, ["not", "an", "object"], DIGEST).reason == \
        "the sidecar answered 200 without a JSON object"
    assert read_answer(503, {"error": "x" * 5000}, DIGEST).reason == "x" * 300  # bounded
