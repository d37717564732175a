"""The gates of one `narwhal` run share their host sessions: one master per physical host.

The runbook asks for one ControlMaster per physical host for the whole run; a gate that
opened its own would log in again (a new host-key check, a new password prompt under
sshpass) and leave masters behind. Here two gate attempts run in one run's Context on a
loopback sshd, and each physical host keeps the master its first command started.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from narwhal.core.errors import GateBlocked
from narwhal.deploy.actions.context import Context
from narwhal.deploy.cli.main import main
from narwhal.deploy.gates import discover
from narwhal.deploy.gates.registry import SPECS
from narwhal.deploy.gates.runner import run_gate
from narwhal.deploy.hosts.ssh import SshHost
from tests.component.conftest import write_env
from tests.component.sshd import Sshd


def _masters(ctx: Context) -> dict[str, int | None]:
    hosts = ctx.sessions()
    return {alias: h.master_pid for alias in hosts.hosts
            if isinstance(h := hosts.get(alias), SshHost)}


def test_two_gate_attempts_in_one_run_reuse_each_hosts_master(sshd: Sshd, tmp_path: Path) -> None:
    env = write_env(tmp_path / ".env", sshd)
    runs = tmp_path / "runs"
    assert main(["hosts", "trust", "--yes", "--env", str(env), "--runs", str(runs),
                 "--ssh-config", "/dev/null"]) == 0
    ctx = Context.load(argparse.Namespace(env=env, runs=runs, ssh_config="/dev/null"))
    assert ctx.sessions() is ctx.sessions()
    seen = []
    try:
        for _ in range(2):
            targets = discover.plan(ctx.inputs)
            with pytest.raises(GateBlocked):  # loopback has no GPUs; the probes still run
                run_gate(SPECS["discover"], ctx.ledger, ctx.fingerprints(), ctx.sessions().roles(),
                         ctx.inputs.revision, {},
                         lambda attempt, t=targets: discover.execute(
                             ctx.inputs, ctx.sessions(), attempt, t, lambda *_: None))
            seen.append(_masters(ctx))
        # node-1 and the router share one login, node-2 logs in with a password: two masters.
        assert set(seen[0]) == {"node-1", "node-2"} and all(seen[0].values())
        assert seen[1] == seen[0]
        attempts = ctx.ledger.load()["gates"]["discover"]["attempts"]
        assert len(attempts) == 2
    finally:
        hosts = [ctx.sessions().get(a) for a in ("node-1", "node-2")]
        ctx.close()
    assert all(isinstance(h, SshHost) and h.master_pid is None for h in hosts)
