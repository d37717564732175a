"""Versioned documents and the one way digests are computed.

Every document Narwhal writes carries `schema` and `schema_version`; every digest is the sha256
of canonical JSON (sorted keys, compact separators, no NaN), so fingerprints, staleness and
attestation agree byte for byte across machines.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from narwhal.core.errors import ContractError

SCHEMA_PREFIX = "narwhal."


def canonical_json(value: Any) -> str:
    """Sorted keys, compact separators, ASCII-safe, no NaN/Infinity."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def digest(value: Any) -> str:
    """`sha256:<hex>` of the canonical JSON of value."""
    return "sha256:" + hashlib.sha256(canonical_json(value).encode()).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stamp(schema: str, version: int, body: dict[str, Any]) -> dict[str, Any]:
    """Return body with its schema name and version in front."""
    if not schema.startswith(SCHEMA_PREFIX):
        raise ValueError(f"schema names start with {SCHEMA_PREFIX!r}: {schema!r}")
    return {"schema": schema, "schema_version": version, **body}


def expect(document: Any, schema: str, version: int) -> dict[str, Any]:
    """Check a parsed document is exactly the named schema and version."""
    if not isinstance(document, dict):
        raise ContractError(f"expected a {schema} object, got {type(document).__name__}")
    got = (document.get("schema"), document.get("schema_version"))
    if got != (schema, version):
        raise ContractError(
            f"expected {schema} v{version}, got {got[0]!r} v{got[1]!r}; "
            "the writer and reader run different Narwhal revisions"
        )
    return document
