"""The one port picker every harness uses: picks never repeat, bind, and stay out of the
ephemeral range that outgoing connections and bind(0) draw from (CI's "Address already in
use" flakes came from both)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from narwhal.lab import ports


def test_many_picks_are_distinct_free_and_below_the_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    picked = ports.free_ports(200)
    assert len(set(picked)) == 200
    assert all(1024 <= port < low for port in picked)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", picked[-1]))  # still free: nothing of ours holds it


def test_a_port_someone_listens_on_is_never_picked() -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    taken = int(holder.getsockname()[1])
    try:  # the only port in range is the one held
        with pytest.raises(OSError, match="no free port"):
            ports.free_port(below=taken + 1, span=1)
    finally:
        holder.close()
