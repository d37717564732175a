"""Engine and attestation URL overrides: http, explicit host and port, a fixed path."""

from __future__ import annotations

from urllib.parse import urlsplit


def check_url(value: str, path: str) -> str:
    """Return the normalised URL or raise ValueError naming the problem."""
    parts = urlsplit(value)
    if parts.scheme != "http":
        raise ValueError("is not an http:// URL")
    if parts.username or parts.password:
        raise ValueError("contains user information")
    if not parts.hostname:
        raise ValueError("has no host")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError("has an invalid port") from exc
    if port is None:
        raise ValueError("has no explicit port")
    if parts.query or parts.fragment:
        raise ValueError("has a query or fragment")
    if parts.path.rstrip("/") != path:
        raise ValueError(f"has path {parts.path!r}, expected {path or 'none'!r}")
    return value.rstrip("/") if not path else value
