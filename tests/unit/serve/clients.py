"""A client connection for unit tests that build a Call without a socket."""

from __future__ import annotations

from narwhal.serve.router.front.front import ClientConnection, Request
from narwhal.serve.router.settings import ClientLimits

_LIMITS = ClientLimits(8192, 32_768, 100, 1024, 64, 0.5, 10.0, 30.0, 60.0)


class _NoHandler:
    def handle(self, conn: ClientConnection, request: Request) -> None:
        raise AssertionError("not used")

    def refused(self, status: int) -> None:
        raise AssertionError("not used")


def unconnected_client() -> ClientConnection:
    """A real ClientConnection with no transport; the Call under test never writes to it."""
    return ClientConnection(_NoHandler(), _LIMITS, _Registry())


class _Registry:
    def admit(self, conn: ClientConnection) -> None:
        pass

    def forget(self, conn: ClientConnection) -> None:
        pass
