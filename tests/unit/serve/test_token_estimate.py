"""Prompt length estimates learn the tokenizer's bytes per token from engine replies."""

from __future__ import annotations

from narwhal.serve.router.request.token_estimate import BytesPerToken


def test_before_any_reply_four_bytes_make_a_token() -> None:
    est = BytesPerToken()
    assert est.tokens("completions", 4000) == 1000
    assert est.tokens("completions", 1) == 1


def test_the_ratio_follows_the_engines_counts_per_route() -> None:
    est = BytesPerToken()
    est.observe("completions", 5000, 4000)  # a tokenizer near one byte per token
    assert est.tokens("completions", 5000) == 4000  # the first reply sets the ratio
    for _ in range(100):
        est.observe("completions", 1100, 1000)
    assert 990 <= est.tokens("completions", 1100) <= 1010
    assert est.tokens("chat", 4000) == 1000  # chat has not been observed: still 4 bytes
    assert est.state()["observed"] == 101


def test_absurd_samples_are_clamped_and_empty_ones_ignored() -> None:
    est = BytesPerToken()
    est.observe("chat", 10, 0)
    est.observe("chat", 0, 10)
    assert est.state()["observed"] == 0
    est.observe("chat", 1_000_000, 1)  # one odd request cannot claim 1 MB per token
    assert est.tokens("chat", 6400) == 100
