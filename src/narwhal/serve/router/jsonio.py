"""JSON on the request path: orjson, with the standard library behind it for encoding only.

orjson parses and encodes request-sized documents much faster than `json`, whose work would
otherwise be a large share of the router's own per request (docs/router.md, "How the hot path
is built"). Parsing is orjson alone: it refuses lone surrogates and nesting deeper than 1024,
which `json` would accept (and then fail on when the body is encoded again, or overflow the
stack), so a client body either parses here or gets a 400. Integer literals beyond 64 bits
come back as floats; call.py refuses them. orjson encodes at most 254 levels, and the standard
library behind it overflows near 1000, so what is parsed must also be bounded to what can be
written again: `nests_deeper` is the check call.py makes.
Encoding falls back to `json` for the Python integers beyond 64 bits orjson will not write.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

JSONDecodeError = json.JSONDecodeError
_STD_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def loads(data: bytes | str) -> Any:
    """Parse JSON; raises ValueError (orjson.JSONDecodeError) with a readable message."""
    return orjson.loads(data)


def nests_deeper(raw: bytes, value: Any, limit: int) -> bool:
    """Whether parsed `value` (from `raw`) holds containers more than `limit` levels deep.
    A body with no more than `limit` brackets cannot, so the common body is judged by two byte
    counts; only a bracket-rich one has its containers walked, each once, stopping at the
    first one too deep."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    level: list[tuple[Any, int]] = [(value, 1)]
    while level:
        node, depth = level.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        level.extend((child, depth + 1) for child in children
                     if isinstance(child, (dict, list)))
    return False


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return _STD_ENCODE(value).encode()
