"""Loopback ports for the processes a test or bench run starts: one picker for every harness.

A port from bind(0) is an ephemeral port: the kernel hands it out again to the next bind(0)
(so two picks in a row can name one port, and two engines then race for it) and to every
outgoing connection (so in the seconds before a slow engine binds its NIXL or KV-events socket,
a connection can take it). Both were seen in CI as "Address already in use". This picker draws
at random from below the ephemeral range, checks the port binds, and never hands one port out
twice in a process.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_LOW = 32768
SPAN = 12000  # how far below the ephemeral range picks are drawn
TRIES = 500

_handed_out: set[int] = set()
_lock = threading.Lock()
_random = random.Random()


def _ephemeral_low() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    return DEFAULT_EPHEMERAL_LOW


def _binds(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", below: int | None = None, span: int = SPAN) -> int:
    """A port that binds on `host` now, in [below - span, below) (default: below the
    ephemeral range), never handed out before."""
    low = _ephemeral_low() if below is None else below
    with _lock:
        for _ in range(TRIES):
            port = _random.randrange(max(1024, low - span), low)
            if port not in _handed_out and _binds(host, port):
                _handed_out.add(port)
                return port
    raise OSError(f"no free port on {host} below {low} after {TRIES} tries")


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct free ports."""
    return [free_port(host) for _ in range(count)]
