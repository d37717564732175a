"""Compare two JSON documents by shape: the same keys at every level, the same JSON kinds.

Values are not compared (a random model says different words each run), but a missing key, an
extra key, or a string where vLLM sends null is exactly what breaks a client, so each such
difference is reported with its path (`$.choices[].usage.prompt_tokens`).
"""

from __future__ import annotations

from typing import Any


def kind(value: Any) -> str:
    """The JSON kind of a decoded value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def shape_diff(want: Any, got: Any, path: str = "$",
               free_maps: frozenset[str] = frozenset()) -> list[str]:
    """Every shape difference between `want` (vLLM) and `got`; [] when they match.

    `free_maps` names object paths whose keys are data, not schema (e.g. the token -> logprob
    map of `top_logprobs`): only the kinds of their values are compared.
    """
    if kind(want) != kind(got):
        return [f"{path}: vLLM sends {kind(want)}, got {kind(got)} ({_short(got)})"]
    if isinstance(want, dict):
        if path in free_maps:
            values = [v for v in got.values()]
            sample = next(iter(want.values()), None)
            return [d for v in values[:1] if sample is not None
                    for d in shape_diff(sample, v, f"{path}.*", free_maps)]
        out = [f"{path}: missing key {k!r}" for k in want if k not in got]
        out += [f"{path}: unexpected key {k!r}" for k in got if k not in want]
        for key in want:
            if key in got:
                out += shape_diff(want[key], got[key], f"{path}.{key}", free_maps)
        return out
    if isinstance(want, list) and want and got:
        return shape_diff(want[0], got[0], f"{path}[]", free_maps)
    return []


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
