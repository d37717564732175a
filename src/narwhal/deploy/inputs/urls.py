"""Engine and attestation URL overrides: http, explicit host and port, a fixed path.

The host follows the same grammar as SSH destinations (hostnames), so a URL cannot carry a host
that no resolver would accept, nor shell characters in its place.
"""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit

from narwhal.deploy.inputs.hostnames import canonical_host


def _split(value: str, schemes: tuple[str, ...], userinfo: str) -> tuple[SplitResult, int | None]:
    """The checks every URL field shares: parseable, one of `schemes`, no user information,
    a host in the SSH destinations' grammar, a port (when written) in range."""
    try:
        parts = urlsplit(value)
    except ValueError as exc:
        raise ValueError(f"is not a URL ({exc})") from None
    if parts.scheme not in schemes:
        raise ValueError(f"is not an {' or '.join(s + '://' for s in schemes)} URL")
    if parts.username or parts.password or "@" in parts.netloc:
        raise ValueError(userinfo)
    if not parts.hostname:
        raise ValueError("has no host")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError("has an invalid port") from exc
    if port is not None and not 1 <= port <= 65535:
        raise ValueError("has a port outside 1-65535")
    canonical_host(parts.netloc.rpartition(":")[0] if port is not None else parts.netloc)
    return parts, port


def check_url(value: str, path: str) -> str:
    """Return the normalised URL or raise ValueError naming the problem."""
    parts, port = _split(value, ("http",), "contains user information")
    if port is None:
        raise ValueError("has no explicit port")
    if parts.query or parts.fragment:
        raise ValueError("has a query or fragment")
    if parts.path.rstrip("/") != path:
        raise ValueError(f"has path {parts.path!r}, expected {path or 'none'!r}")
    return value.rstrip("/") if not path else value


def url_bind(value: str) -> tuple[str, int]:
    """(host, port) of a checked http://HOST:PORT, as a server binds it."""
    parts = urlsplit(value)
    return (parts.hostname or "").lower(), int(parts.port or 0)


def check_hub_endpoint(value: str) -> str:
    """HF_ENDPOINT: an http(s) URL of a hub (huggingface.co or a mirror), host and optional
    port only, so nothing but a hub's address reaches huggingface_hub; the URL, no slash after."""
    parts, _ = _split(value, ("http", "https"),
                      "contains user information (a token belongs in NARWHAL_HF_TOKEN)")
    if parts.query or parts.fragment or parts.path.rstrip("/"):
        raise ValueError("has a path, query or fragment (give the hub's address only)")
    return value.rstrip("/")
