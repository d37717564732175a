"""Prompt tokens from body bytes, learned from what the engines report.

Placement must price a prompt before any engine has counted it. A fixed 4 bytes per token
(English BPE) is badly wrong for other tokenizers and languages: a character-level or a
CJK-heavy vocabulary can be 1 byte per token or less, and a fixed ratio then underprices
every prefill by that factor, admits what cannot meet TTFT and sizes the prefill pool too
small. So the ratio is learned: every prefill reply carries the exact `prompt_tokens`, and
an exponentially weighted mean of body bytes per token is kept per route (a chat body has
message structure a completion body has not). Until the first reply the ratio is 4.

The mean is clamped to [0.25, 64] bytes per token so one odd request cannot swing it to a
value no tokenizer produces; each observation moves it by `WEIGHT`, so a mix that shifts is
followed within some tens of requests.
"""

from __future__ import annotations

START_BYTES_PER_TOKEN = 4.0
WEIGHT = 0.05
LOW, HIGH = 0.25, 64.0


class BytesPerToken:
    """Learned body bytes per prompt token, one mean per route."""

    __slots__ = ("_ratio", "observed")

    def __init__(self) -> None:
        self._ratio: dict[str, float] = {}
        self.observed = 0

    def tokens(self, route: str, body_bytes: int) -> int:
        """The estimated prompt tokens of a `body_bytes` body on `route` (at least 1)."""
        ratio = self._ratio.get(route, START_BYTES_PER_TOKEN)
        n = int(body_bytes / ratio)
        return n if n > 0 else 1

    def observe(self, route: str, body_bytes: int, prompt_tokens: int) -> None:
        """An engine counted `prompt_tokens` for a body of `body_bytes` on `route`."""
        if prompt_tokens <= 0 or body_bytes <= 0:
            return
        sample = body_bytes / prompt_tokens
        sample = LOW if sample < LOW else HIGH if sample > HIGH else sample
        old = self._ratio.get(route)
        self._ratio[route] = sample if old is None else old + WEIGHT * (sample - old)
        self.observed += 1

    def state(self) -> dict[str, object]:
        return {"bytes_per_token": {r: round(v, 3) for r, v in sorted(self._ratio.items())},
                "observed": self.observed}
