"""Startup-log facts: attention backend, KV layout, available KV memory and capacity lines.

vLLM does not log block counts, but it does log the layout it resolved and the cache size and
concurrency it computed, which are compared with the prediction. Lines are matched anywhere in
a line so process prefixes like `(EngineCore_DP0 pid=1) INFO 11-30 10:00:00 [file.py:1]` pass.
"""

from __future__ import annotations

import re

from pydantic import Field

from narwhal.core.document_io import StrictModel
from narwhal.core.errors import ContractError

_LAYOUT_LINES = (
    re.compile(r"Using (?P<layout>[A-Z]{3,5}) KV cache layout\."),
    re.compile(r"Detected kv cache layout (?P<layout>[A-Z]{3,5})\b"),
)
_BACKENDS = re.compile(r"Detected attention backend\(s\) \[(?P<names>[^\]]*)\]")
_AVAILABLE = re.compile(r"Available KV cache memory: (?P<gib>[0-9.]+) GiB")
_CAPACITY = re.compile(
    r"(?P<device>\w+) KV cache size: (?P<tokens>[0-9,]+) tokens, Maximum concurrency for "
    r"(?P<max_len>[0-9,]+) tokens per request: (?P<conc>[0-9.]+)x"
)
_HASH_PASSED = re.compile(r"NIXL compatibility check passed \(hash: (?P<hash>[0-9a-f]+)")


class StartupFacts(StrictModel):
    """What one engine's startup log says about its KV cache; cache-layout.json's `startup`."""

    kv_cache_layout: str = Field(max_length=64)
    attention_backends: tuple[str, ...]
    available_kv_gib: float | None
    kv_cache_tokens: int | None
    max_model_len: int | None
    max_concurrency: float | None
    device: str | None
    compatibility_hash_passed: str | None


def parse_layout(text: str) -> str:
    """The one KV layout the engine reports; zero, or two different ones, is a ContractError."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        for pattern in _LAYOUT_LINES:
            match = pattern.search(line)
            if match:
                found.setdefault(match["layout"], line.strip())
    if not found:
        raise ContractError("startup log has no 'Using <LAYOUT> KV cache layout.' line; "
                            "capture the log from engine start, at INFO level")
    if len(found) > 1:
        lines = "; ".join(f"{k}: {v!r}" for k, v in found.items())
        raise ContractError(f"startup log reports {len(found)} different KV layouts ({lines}); "
                            "one engine must resolve exactly one layout")
    return next(iter(found))


def _num(text: str) -> int:
    return int(text.replace(",", ""))


def parse_capacity(text: str) -> tuple[str, int, int, float] | None:
    """(device, tokens, max_model_len, concurrency) from the one KV cache size line, if any."""
    caps = set(_CAPACITY.findall(text))
    if len(caps) > 1:
        raise ContractError(f"log has {len(caps)} different KV cache size lines; "
                            "capture one engine's log")
    cap = _CAPACITY.search(text)
    if cap is None:
        return None
    return cap["device"], _num(cap["tokens"]), _num(cap["max_len"]), float(cap["conc"])


def parse_startup_log(text: str) -> StartupFacts:
    """Read every KV fact the log states; the layout is required, the rest may be absent."""
    layout = parse_layout(text)
    backends: tuple[str, ...] = ()
    if (m := _BACKENDS.search(text)) is not None:
        backends = tuple(n.strip().strip("'\"") for n in m["names"].split(",") if n.strip())
    avail = _AVAILABLE.search(text)
    cap = parse_capacity(text)
    passed = _HASH_PASSED.search(text)
    return StartupFacts(
        kv_cache_layout=layout,
        attention_backends=backends,
        available_kv_gib=float(avail["gib"]) if avail else None,
        kv_cache_tokens=cap[1] if cap else None,
        max_model_len=cap[2] if cap else None,
        max_concurrency=cap[3] if cap else None,
        device=cap[0] if cap else None,
        compatibility_hash_passed=passed["hash"] if passed else None,
    )
