"""A real OpenSSH server on loopback for tests: own host key, own config, own users.

It runs in a private mount namespace where /etc/passwd and /etc/shadow are bind-mounted copies
with two test users, so password auth is real without touching the machine's accounts.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from narwhal.lab.ports import free_port as free_port  # one picker for every harness

KEY_USER = "nwkey"
PASS_USER = "nwpass"
PASSWORD = "nw-Test-pass-7731"


def missing_prerequisite() -> str | None:
    """Why a real sshd cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root to run sshd with its own users in a private mount namespace"
    for tool in ("/usr/sbin/sshd", "ssh", "sshpass", "ssh-keygen", "unshare", "openssl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make bootstrap installs it)"
    return None


@dataclass
class Sshd:
    root: Path
    port: int
    client_key: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def host_key(self) -> Path:
        return self.root / "ssh_host_ed25519_key"

    def _write_accounts(self) -> Path:
        etc = self.root / "etc"
        etc.mkdir(exist_ok=True)
        hashed = subprocess.run(["openssl", "passwd", "-6", PASSWORD], capture_output=True,
                                check=True).stdout.decode().strip()
        passwd = Path("/etc/passwd").read_text()
        shadow = Path("/etc/shadow").read_text()
        for uid, user in ((42101, KEY_USER), (42102, PASS_USER)):
            home = self.root / "home" / user
            home.mkdir(parents=True, exist_ok=True)
            os.chown(home, uid, uid)
            passwd += f"{user}:x:{uid}:{uid}::{home}:/bin/sh\n"
            shadow += f"{user}:{hashed if user == PASS_USER else '*'}:19000:0:99999:7:::\n"
        (etc / "passwd").write_text(passwd)
        (etc / "shadow").write_text(shadow)
        (etc / "shadow").chmod(0o600)
        return etc

    def prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for key in (self.host_key, self.client_key):
            if not key.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                               check=True)
        auth = self.root / "authorized_keys"
        auth.write_text(Path(f"{self.client_key}.pub").read_text())
        auth.chmod(0o644)
        self.root.chmod(0o755)
        self._write_accounts()
        (self.root / "sshd_config").write_text(f"""\
Port {self.port}
ListenAddress 127.0.0.1
HostKey {self.host_key}
PidFile {self.root}/sshd.pid
UsePAM no
PermitRootLogin no
PasswordAuthentication yes
KbdInteractiveAuthentication no
AuthorizedKeysFile {auth}
StrictModes no
UseDNS no
MaxStartups 100:30:200
MaxSessions 50
LogLevel ERROR
""")

    def start(self) -> None:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        etc = self.root / "etc"
        script = ('mount --bind "$1/passwd" /etc/passwd && mount --bind "$1/shadow" /etc/shadow '
                  '&& exec /usr/sbin/sshd -D -e -f "$2"')
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
             str(etc), str(self.root / "sshd_config")],
            stdout=subprocess.DEVNULL, stderr=open(self.root / "sshd.log", "ab"))  # noqa: SIM115
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError((self.root / "sshd.log").read_text()) from None
                time.sleep(0.05)
        raise RuntimeError("sshd did not start listening within 10 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def rekey(self) -> None:
        """Give the server a new host key (as a reinstalled or impostor host would have)."""
        self.stop()
        self.host_key.unlink()
        Path(f"{self.host_key}.pub").unlink()
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                        str(self.host_key)], check=True)
        self.start()
