"""Deterministic output: the same token ids give the same next token on any emulator.

Each step's choice is drawn from a digest of every id before it (the prompt's and the tokens
generated so far), as a greedy model's is a function of its context. So a decode that pulled
its KV from another emulator produces exactly what a local decode of the same prompt produces
(the P/D handoff can be checked token for token and logprob for logprob, as the real tier does
with real vLLM), and a request continued from its prompt plus the first k tokens it generated
produces exactly the tokens the uninterrupted request would have produced after them (the
router's mid-stream continuation is checked the same way).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from narwhal.lab.engine.tokenizer import Tokenizer

_MASK = (1 << 64) - 1
# Added to a step's state before mixing. Any odd constant spreads as well; this one keeps the
# first step of Gate C's capture completion ("The quick brown fox") from being EOS on the
# emulated models (tests/unit/engine/test_tokens.py), as no real model answers it with
# nothing, where 0x9E3779B97F4A7C15 made the Llama-3-shaped one stop at once (EOS is drawn
# with the configured probability at every step, so some prompt always stops at once).
_STEP = 0x2545F4914F6CDD1D


def _mix(x: int) -> int:
    """splitmix64's finalizer: a cheap, well-spread 64-bit hash of one integer."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
    return x ^ (x >> 31)


def prompt_seed(prompt_ids: Sequence[int]) -> int:
    """64-bit digest of the ids: the state the step after them draws from."""
    data = array("q", prompt_ids).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@dataclass(frozen=True)
class Planned:
    """A request's whole output, decided at admission (the scheduler only paces it).
    `states[k]` is the digest of the prompt and the first k tokens: what step k drew from."""

    states: list[int]
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS) or "length"


class Generator:
    """Picks tokens among readable words; EOS with a fixed chance per step, never before min."""

    def __init__(self, tokenizer: Tokenizer, eos_probability: float) -> None:
        self._tok = tokenizer
        self._choices = tokenizer.generation_ids
        self._eos = tokenizer.eos_id
        self._eos_cut = int(min(max(eos_probability, 0.0), 1.0) * (1 << 32))

    def plan(self, prompt_ids: Sequence[int], max_tokens: int, min_tokens: int,
             ignore_eos: bool) -> Planned:
        # one running digest over the ids: the state after the prompt and k tokens is the
        # digest a request whose prompt is exactly those ids starts from
        digest = hashlib.blake2b(array("q", prompt_ids).tobytes(), digest_size=8)
        out: list[int] = []
        states: list[int] = []
        choices = self._choices
        n = len(choices)
        eos_allowed = self._eos is not None and not ignore_eos and self._eos_cut > 0
        for step in range(max_tokens):
            state = int.from_bytes(digest.digest(), "little")
            states.append(state)
            x = _mix(state + _STEP & _MASK)
            if eos_allowed and step >= min_tokens and (x >> 32) < self._eos_cut:
                assert self._eos is not None
                out.append(self._eos)
                return Planned(states, out, "stop")
            token = choices[x % n]
            out.append(token)
            digest.update(array("q", (token,)).tobytes())
        return Planned(states, out, "length")

    def logprobs(self, state: int, token: int,
                 top: int) -> tuple[float, list[tuple[int, float]]]:
        """(logprob of `token`, the `top` best tokens best first) at the step that drew from
        `state`: `token` ranks first, as the output of a greedy decode would; alternatives are
        distinct and strictly worse."""
        x = _mix(state ^ 0xD6E8FEB86659FD93)
        chosen = -0.001 - ((x >> 40) / (1 << 24)) * 2.0
        if top <= 0:
            return chosen, []
        ranked: list[tuple[int, float]] = [(token, chosen)]
        seen = {token}
        choices = self._choices
        for k in range(1, 4 * top + 8):
            if len(ranked) >= top:
                break
            y = _mix(x + k)
            alt = choices[y % len(choices)]
            if alt in seen:
                continue
            seen.add(alt)
            ranked.append((alt, chosen - 0.25 * len(ranked) - (y >> 58) / 256.0))
        return chosen, ranked
