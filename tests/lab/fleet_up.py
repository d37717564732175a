"""A lab fleet brought through the gates by the product itself (install, then C, D and E as
asked), and taken down afterwards: the containers removed, the sidecars the attest attempts
started ended by their owner records. Shared by the lab modules that start after a gate."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from tests.lab.installing import Installer

from narwhal.lab.plan import LabPlan
from narwhal.lab.testing import ssh

GATE_ARGS = {"engines": (), "fabric": ("--seconds", "1", "--omit", "0"), "attest": ()}


def clear_containers(plan: LabPlan) -> None:
    for h in plan.engines():
        ssh(plan, h.name, "docker ps -aq | xargs -r docker rm -f >/dev/null")


def stop_sidecars(installer: Installer, gates: tuple[str, ...] = ("attest", "serve")) -> None:
    """End the processes the attest and serve attempts started (sidecars, routers, Prometheus;
    by pid and start time, as owned), so the next module finds their ports free. In a
    deployment they keep running."""
    for owned in (o for g in gates for o in (installer.op.runs / "lab" / g).glob("*/owned.jsonl")):
        for line in owned.read_text().splitlines():
            row = json.loads(line)
            if row["kind"] != "process":
                continue
            pid, ticks = int(row["pid"]), int(row["start_ticks"])
            ssh(installer.op.plan, installer.lab_host(row["host"]),
                f"s=$(cat /proc/{pid}/stat 2>/dev/null) && t=$(echo \"${{s##*) }}\" | cut -d' ' "
                f"-f20) && [ \"$t\" = {ticks} ] && kill {pid}; true")


@contextmanager
def through(installer: Installer, *gates: str) -> Iterator[Installer]:
    """Install, then pass `gates` in order (each must pass); undo it all on the way out."""
    done = installer.install()
    assert done.returncode == 0, done.stdout + done.stderr
    clear_containers(installer.op.plan)
    try:
        for gate in gates:
            code, doc = installer.op.json_command(gate, *GATE_ARGS[gate])
            assert code == 0 and doc["verdict"] == "passed", doc
        yield installer
    finally:
        stop_sidecars(installer)
        clear_containers(installer.op.plan)
