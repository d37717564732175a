"""Helpers for lab tests: plain OpenSSH from the workstation namespace, with a pinned host key.

Until the product's SSH hosts exist, tests reach lab hosts the way an operator would by hand:
`ssh -i key -o StrictHostKeyChecking=yes`, and `sshpass -e` (password in SSHPASS, never argv).
"""

from __future__ import annotations

import os
import subprocess

from narwhal.lab.hostfs import password_file
from narwhal.lab.plan import LabPlan


def ssh(plan: LabPlan, host: str, command: str, *, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run command on a lab host from the workstation namespace, as root, key or password auth."""
    h = plan.host(host)
    password_user = next((u for u in h.host.users if u.name == "root" and u.auth == "password"), None)
    opts = ["-F", "/dev/null", "-o", f"UserKnownHostsFile={plan.known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes",
            "-o", "ConnectTimeout=5", "-o", "KexAlgorithms=curve25519-sha256", "-o", "LogLevel=ERROR"]
    env = dict(os.environ)
    if password_user is not None:
        env["SSHPASS"] = password_file(plan, h.name, "root").read_text()
        argv = ["sshpass", "-e", "ssh", *opts, "-o", "PreferredAuthentications=password",
                "-o", "PubkeyAuthentication=no"]
    else:
        argv = ["ssh", *opts, "-i", str(plan.client_key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes"]
    argv = ["ip", "netns", "exec", plan.ws_netns, *argv, f"root@{h.mgmt_ip}", command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, check=False)
