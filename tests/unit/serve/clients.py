"""A client connection for unit tests that build a Call without a socket."""

from __future__ import annotations

from narwhal.serve.front import ClientConnection, Request


class _NoHandler:
    def handle(self, conn: ClientConnection, request: Request) -> None:
        raise AssertionError("not used")

    def refused(self, status: int) -> None:
        raise AssertionError("not used")


def unconnected_client() -> ClientConnection:
    """A real ClientConnection with no transport; the Call under test never writes to it."""
    return ClientConnection(_NoHandler(), 1024, set())
