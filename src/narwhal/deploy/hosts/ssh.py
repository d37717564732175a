"""A host reached with the OpenSSH client through one ControlMaster per physical host.

Host keys come only from the deployment's own known_hosts (StrictHostKeyChecking=yes); keys
authenticate in BatchMode; a password reaches `sshpass -e` only through the SSHPASS variable of
the master connection, so it is never in any argv, log or record.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from narwhal.core.errors import ClientToolMissing, HostError, HostKeyChanged, HostUnreachable
from narwhal.core.secret import Secret
from narwhal.deploy.hosts import commandline as cl
from narwhal.deploy.hosts.base import Host
from narwhal.deploy.hosts.trust import pinned_fingerprints, scan_fingerprints
from narwhal.deploy.inputs.destination import Destination

UNREACHABLE_MARKERS = ("Connection timed out", "Connection refused", "No route to host",
                       "Could not resolve hostname", "Network is unreachable",
                       "Operation timed out", "Connection closed by")
KEY_MARKERS = ("REMOTE HOST IDENTIFICATION HAS CHANGED", "Host key verification failed",
               "No ED25519 host key is known", "No ECDSA host key is known",
               "No RSA host key is known")


class SshHost(Host):
    transport = "ssh"

    def __init__(self, alias: str, destination: Destination, *, known_hosts: Path,
                 control_dir: Path, key: str | None = None, password: Secret | None = None,
                 connect_timeout: int = 10, ssh_config: str | None = None) -> None:
        super().__init__(alias)
        self.destination = destination
        self.known_hosts = known_hosts
        self.control_path = control_dir / f"{alias}.sock"
        self.key = key
        self.password = password
        self.connect_timeout = connect_timeout
        self.ssh_config = ssh_config
        self._master: subprocess.Popen[bytes] | None = None
        # Gates run one host's commands from several threads (engines sharing a host start
        # at once): one of them starts the master while the others wait for it, instead of
        # each stopping the master another is still starting.
        self._master_lock = threading.Lock()

    def _options(self) -> list[str]:
        opts = [
            "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes",
            "-o", "HashKnownHosts=no",
            "-o", f"ConnectTimeout={self.connect_timeout}",
            "-o", "ServerAliveInterval=5",
            "-o", "ServerAliveCountMax=3",
            "-o", f"ControlPath={self.control_path}",
            "-o", "LogLevel=ERROR",
            "-o", "KexAlgorithms=curve25519-sha256,curve25519-sha256@libssh.org,"
                  "sntrup761x25519-sha512@openssh.com",
        ]
        if self.ssh_config:
            opts = ["-F", self.ssh_config, *opts]
        if self.destination.port:
            opts += ["-p", str(self.destination.port)]
        if self.password is not None:
            opts += ["-o", "PubkeyAuthentication=no",
                     "-o", "PreferredAuthentications=password,keyboard-interactive",
                     "-o", "NumberOfPasswordPrompts=1"]
        elif self.key:
            opts += ["-i", self.key, "-o", "IdentitiesOnly=yes",
                     "-o", "PasswordAuthentication=no", "-o", "KbdInteractiveAuthentication=no"]
        return opts

    def _start_master(self) -> None:
        """Start the one master connection of this host and wait for its control socket.

        The master stays a child of this process (no -f): under sshpass a forked-off master
        would lose its pseudo-terminal and die.
        """
        self._stop_master()
        argv = ["ssh", *self._options(), "-M", "-N", "-o", "ControlMaster=yes"]
        env = dict(os.environ)
        if self.password is not None:
            argv = ["sshpass", "-e", *argv, "-o", "BatchMode=no"]
            env["SSHPASS"] = self.password.reveal()
        else:
            argv += ["-o", "BatchMode=yes"]
        argv += [self.destination.target]
        log = self.session_log()
        with open(log, "wb") as err:
            try:
                master = self._master = subprocess.Popen(argv, env=env,
                                                         stdin=subprocess.DEVNULL,
                                                         stdout=subprocess.DEVNULL, stderr=err,
                                                         start_new_session=True)
            except FileNotFoundError:
                # Not the host's fault: named as the workstation's, not left as a traceback.
                raise ClientToolMissing(self.alias, argv[0], self.password.name
                                        if argv[0] == "sshpass" and self.password is not None
                                        else "every SSH host") from None
        deadline = time.monotonic() + self.connect_timeout + 5
        while not self.control_path.exists():
            status = master.poll()
            if status is not None:
                self._master = None
                self._classify(status, log.read_text(errors="replace"))
            if time.monotonic() > deadline:
                self._stop_master()
                raise HostUnreachable(self.alias, f"no SSH answer within "
                                      f"{self.connect_timeout} s; check the route, port and "
                                      "firewall")
            time.sleep(0.02)

    def _ensure_master(self) -> None:
        with self._master_lock:
            if not self._master_alive():
                self._start_master()

    def _master_alive(self) -> bool:
        return (self._master is not None and self._master.poll() is None
                and self.control_path.exists())

    def _stop_master(self) -> None:
        master, self._master = getattr(self, "_master", None), None
        if master is not None and master.poll() is None:
            master.terminate()
            try:
                master.wait(timeout=5)
            except subprocess.TimeoutExpired:
                master.kill()
                master.wait()

    def _classify(self, status: int, stderr: str) -> None:
        if any(m in stderr for m in KEY_MARKERS):
            pinned = pinned_fingerprints(self.known_hosts, self.destination)
            if not pinned:
                raise HostError(self.alias, "host key is not pinned; run `narwhal hosts trust` "
                                "and verify the fingerprint it shows")
            presented = scan_fingerprints(self.destination, self.connect_timeout)
            raise HostKeyChanged(self.alias, ", ".join(pinned), ", ".join(presented) or "unknown")
        if any(m in stderr for m in UNREACHABLE_MARKERS):
            reason = next(m for m in UNREACHABLE_MARKERS if m in stderr)
            raise HostUnreachable(self.alias, f"cannot connect ({reason.lower()}) within "
                                  f"{self.connect_timeout} s; check the route, port and firewall")
        if "Permission denied" in stderr or status == 5:
            raise HostError(self.alias, "authentication failed; check the user, the key "
                            "(NARWHAL_SSH_KEY) or the password variable")
        last = stderr.strip().splitlines()[-1:] or [f"ssh exited {status}"]
        raise HostError(self.alias, f"ssh failed: {last[0][:200]}")

    def _exec(self, argv: tuple[str, ...], stdin: bytes | None, timeout: float | None,
              env: Mapping[str, str] | None) -> tuple[int, bytes, bytes]:
        if env:
            raise HostError(self.alias, "environment variables cannot be sent over SSH; "
                            "pass values as files or stdin")
        self._ensure_master()
        ssh = ["ssh", *self._options(), "-o", "ControlMaster=no", "-o", "BatchMode=yes", "-T",
               self.destination.target, "--", cl.remote_line(argv)]
        try:
            done = subprocess.run(ssh, input=stdin if stdin is not None else b"",
                                  capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise HostError(self.alias, f"`{argv[0]}` did not finish within {timeout} s",
                            command=argv[0]) from None
        if done.returncode == 255 and b"Control socket" in done.stderr:
            with self._master_lock:
                self._stop_master()  # the next call opens a fresh master
        return done.returncode, done.stdout, done.stderr

    def interactive(self, argv: Sequence[str]) -> int:
        """Run argv with this terminal attached (a role shell) over the master; its status."""
        self._ensure_master()
        ssh = ["ssh", *self._options(), "-o", "ControlMaster=no", "-o", "BatchMode=yes", "-t",
               self.destination.target, "--", cl.remote_line(argv)]
        return subprocess.call(ssh)

    def forward(self, local_port: int, remote_host: str, remote_port: int) -> int:
        self._control("forward", local_port, remote_host, remote_port)
        return local_port

    def cancel_forward(self, local_port: int, remote_host: str, remote_port: int) -> None:
        self._control("cancel", local_port, remote_host, remote_port)

    def _control(self, verb: str, local_port: int, remote_host: str, remote_port: int) -> None:
        self._ensure_master()
        spec = f"127.0.0.1:{int(local_port)}:{remote_host}:{int(remote_port)}"
        done = subprocess.run(["ssh", *self._options(), "-O", verb, "-L", spec,
                               self.destination.target], capture_output=True, check=False)
        if done.returncode != 0:
            raise HostError(self.alias, f"port forward {verb} failed: "
                            f"{done.stderr.decode('utf-8', 'replace').strip()[:200]}")

    def session_log(self) -> Path:
        """The master connection's stderr (started afresh with each master)."""
        return self.control_path.with_suffix(".log")

    @property
    def master_pid(self) -> int | None:
        """The live master connection's pid (None before the first command or after close)."""
        return self._master.pid if self._master_alive() and self._master is not None else None

    def close(self) -> None:
        with self._master_lock:
            self._stop_master()
