"""Native: the engine as a plain process of the host (`vllm serve`, or the record's
entrypoint), in its own session, logging to the run dir's engine.log.

A process sees every GPU unless told, so its environment names the record's GPUs
(CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES). Its identity is its pid and kernel start time:
a pid reused by another process is never taken for the engine, nor signalled.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from narwhal.core import launch_record as lr
from narwhal.core.transfer_path import TransferPath
from narwhal.node.engine.runtimes.base import Ran, Started, file_tail

STOP_GRACE_S = 20.0


def start_ticks(pid: int) -> str:
    """The kernel start time of a live pid; a zombie (exited, not yet reaped) counts as gone."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        raise ProcessLookupError(pid)
    return fields[19]


class NativeRuntime:
    name = "native"
    contained = False

    def visible_devices(self, record: lr.LaunchRecord) -> dict[str, str]:
        if not record.devices:
            return {}
        uuids = ",".join(d.uuid for d in record.devices)
        return {"CUDA_VISIBLE_DEVICES" if record.accelerator == "nvidia"
                else "ROCR_VISIBLE_DEVICES": uuids}

    def container_name(self, record: lr.LaunchRecord) -> str | None:
        return None

    def launch_argv(self, record: lr.LaunchRecord, env: dict[str, str],
                    path: TransferPath | None, serve: list[str]) -> list[str]:
        return [*(record.entrypoint or ("vllm", "serve")), *serve]

    def plan_environment(self, env: dict[str, str]) -> dict[str, str]:
        return env

    def start(self, plan: dict[str, Any], env: dict[str, str], log_path: Path,
              owned: frozenset[tuple[str, str]]) -> tuple[Started, Ran]:
        with log_path.open("ab") as log:
            proc = subprocess.Popen(plan["argv"], env={**env, **plan["environment"]},
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    start_new_session=True, cwd=plan["run_dir"])
        return Started(self.name, str(proc.pid), start_ticks(proc.pid)), []

    def alive(self, started: Started) -> bool:
        try:
            return start_ticks(int(started.id)) == started.created
        except OSError:
            return False

    def logs(self, started: Started, log_path: Path) -> str:
        return log_path.read_text(errors="replace") if log_path.exists() else ""

    def log_tail(self, started: Started, log_path: Path, limit: int) -> tuple[bytes, int]:
        return file_tail(log_path, limit)

    def log_source(self, started: Started, log_path: Path) -> str:
        return str(log_path)

    def stop(self, started: Started) -> str:
        if not self.alive(started):
            return "already gone"
        os.killpg(int(started.id), 15)
        deadline = time.monotonic() + STOP_GRACE_S  # "stopped" means gone, not signalled
        while self.alive(started) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.alive(started):
            os.killpg(int(started.id), 9)
            return "killed: it did not exit within the grace period"
        return "stopped"


RUNTIME = NativeRuntime()
