"""Response bytes the router writes to clients: heads, OpenAI-shaped errors, SSE error events.

Heads are assembled from constant pieces; the only per-request parts are the status, the
length and the request id.
"""

from __future__ import annotations

from http import HTTPStatus

from narwhal.serve.router.jsonio import dumps, loads

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}

# (type, default code) per status, following the shapes OpenAI-compatible clients expect.
_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "timeout",
    413: "invalid_request_error",
    414: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "server_error",
    502: "engine_error",
    503: "service_unavailable",
    504: "timeout",
}

JSON: bytes = b"application/json"
SSE_HEAD_FIXED = (b"content-type: text/event-stream; charset=utf-8\r\n"
                  b"cache-control: no-cache\r\n")


def error_body(status: int, message: str, *, code: str | None = None,
               param: str | None = None) -> bytes:
    """{"error":{"message","type","param","code"}} as OpenAI clients parse it."""
    return dumps({"error": {
        "message": message,
        "type": _ERROR_TYPES.get(status, "server_error"),
        "param": param,
        "code": code,
    }})


def sse_error_event(message: str, code: str) -> bytes:
    """The event a client sees when a stream breaks after it started, then the stream end."""
    payload = dumps({"error": {"message": message, "type": "engine_error", "param": None,
                               "code": code}})
    return b"data: " + payload + b"\n\ndata: [DONE]\n\n"


def head(status: int, request_id: bytes, keep_alive: bool, *, content_type: bytes = JSON,
         length: int | None = None, extra: bytes = b"") -> bytes:
    """A response head; `length=None` means a chunked body follows."""
    out = b"HTTP/1.1 %d %b\r\ncontent-type: %b\r\n" % (
        status, _REASONS.get(status, b"Unknown"), content_type)
    if request_id:
        out += b"x-request-id: %b\r\n" % request_id
    out += extra
    if length is None:
        out += b"transfer-encoding: chunked\r\n"
    else:
        out += b"content-length: %d\r\n" % length
    if not keep_alive:
        out += b"connection: close\r\n"
    return out + b"\r\n"


def stream_head(request_id: bytes, keep_alive: bool, chunked: bool) -> bytes:
    """Head of an SSE response; an HTTP/1.0 client gets an unframed body ended by close."""
    out = b"HTTP/1.1 200 OK\r\n" + SSE_HEAD_FIXED + b"x-request-id: %b\r\n" % request_id
    if chunked:
        out += b"transfer-encoding: chunked\r\n"
    if not keep_alive:
        out += b"connection: close\r\n"
    return out + b"\r\n"


def engine_text(payload: bytes) -> str:
    """The start of an engine's answer, for a message."""
    return payload[:300].decode("utf-8", "replace")


def engine_error_body(status: int, payload: bytes) -> bytes:
    """An engine's 4xx as it wrote it when it is OpenAI-shaped (vLLM's are), else wrapped."""
    if not 400 <= status < 500:
        return b""
    try:
        ok = isinstance(loads(payload).get("error"), dict)
    except (ValueError, AttributeError):
        ok = False
    return payload if ok else error_body(status, payload[:500].decode("utf-8", "replace"),
                                         code="engine_rejected")
