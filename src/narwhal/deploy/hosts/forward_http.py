"""HTTP to the router host's private services from the workstation, through SSH forwards.

Gate G's checks and the capacity trial both reach the router and Prometheus the way an
operator would on the private path: a forward from a free workstation port through the host's
master connection, and plain HTTP to that port. Every forward's open and cancel is noted in a
tunnel log (trial/tunnel_log.py), so a trial that could not reach the router is read from its
record.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from narwhal.core.errors import HostError
from narwhal.deploy.hosts.base import Host
from narwhal.deploy.trial.tunnel_log import TunnelLog


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(url: str, body: dict[str, Any] | None = None,
         headers: dict[str, str] | None = None, timeout_s: float = 60.0) -> tuple[int, bytes]:
    """One request through a tunnel's local port: (status, at most 1 MiB of body); status 0
    with the error's text when nothing answered."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={  # noqa: S310 - the tunnel's port
        "Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as reply:  # noqa: S310
            return int(reply.status), reply.read(1 << 20)
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read(1 << 20)
    except OSError as exc:
        return 0, str(exc).encode()


def _open(host: Host, log: TunnelLog, remote: tuple[str, int]) -> int:
    """One forward from a free workstation port; the port it answers on (noted in `log`)."""
    wanted, started = _free_port(), time.time()
    try:
        local = host.forward(wanted, *remote)
    except HostError as exc:
        log.add("open", started, wanted, remote, str(exc))
        raise
    log.add("open", started, local, remote)
    return local


def _cancel(host: Host, log: TunnelLog, local: int, remote: tuple[str, int]) -> None:
    started = time.time()
    try:
        host.cancel_forward(local, *remote)
    except HostError as exc:
        log.add("cancel", started, local, remote, str(exc))
        return  # the master's end closes it anyway; the row says it did not answer
    log.add("cancel", started, local, remote)


@contextlib.contextmanager
def forwarded(host: Host, remotes: list[tuple[str, int]],
              log: TunnelLog | None = None) -> Iterator[list[int]]:
    """SSH forwards from free workstation ports to `remotes` on the host's side, through the
    host's master connection; every one cancelled on the way out, and every open and cancel
    noted in `log` when one is given (the trial's tunnel log)."""
    log = log if log is not None else TunnelLog(host.alias, host.transport, None)
    made: list[tuple[int, tuple[str, int]]] = []
    try:
        for remote in remotes:
            made.append((_open(host, log, remote), remote))
        yield [local for local, _ in made]
    finally:
        for local, remote in made:
            _cancel(host, log, local, remote)
