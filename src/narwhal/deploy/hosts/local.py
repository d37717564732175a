"""The workstation itself (and a single-machine fleet) as a host."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping

from narwhal.core.errors import HostError
from narwhal.deploy.hosts.base import Host


class LocalHost(Host):
    transport = "local"

    def __init__(self, alias: str = "workstation") -> None:
        super().__init__(alias)

    def _exec(self, argv: tuple[str, ...], stdin: bytes | None, timeout: float | None,
              env: Mapping[str, str] | None) -> tuple[int, bytes, bytes]:
        full_env = None if env is None else {**os.environ, **env}
        try:
            done = subprocess.run(argv, input=stdin if stdin is not None else b"",
                                  capture_output=True, timeout=timeout, env=full_env, check=False)
        except FileNotFoundError:
            return 127, b"", f"{argv[0]}: command not found\n".encode()
        except subprocess.TimeoutExpired:
            raise HostError(self.alias, f"`{argv[0]}` did not finish within {timeout} s",
                            command=argv[0]) from None
        return done.returncode, done.stdout, done.stderr

    def forward(self, local_port: int, remote_host: str, remote_port: int) -> int:
        """The workstation needs no tunnel to itself: the remote port is the local port."""
        return remote_port
