"""A seeded open-loop schedule: Poisson arrivals at a rate, each request with its own id.

The arrival times are fixed before anything is sent (open loop: a slow answer never delays
the next send), and the same seed gives the same schedule, so two trials of one fleet are
comparable request by request.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Planned:
    request_id: str
    at_s: float  # seconds after the rate's start
    prompt_words: int
    max_tokens: int
    prompt: str | None = None  # a replayed trace's own text; None: prompt_words unique words


def schedule(rate: float, requests: int, seed: int, prompt_words: int, max_tokens: int,
             tag: str) -> list[Planned]:
    """`requests` arrivals at `rate` per second (exponential gaps), ids `<tag>-<n>`."""
    if rate <= 0 or requests < 1:
        raise ValueError("a schedule needs a positive rate and at least one request")
    rng = random.Random(f"{seed}:{rate}")
    t, out = 0.0, []
    for n in range(requests):
        out.append(Planned(f"{tag}-{n:05d}", t, prompt_words, max_tokens))
        t += rng.expovariate(rate)
    return out
