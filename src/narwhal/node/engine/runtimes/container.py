"""What docker and podman share: the same CLI verbs (run, inspect, logs, rm) and flags.

Each is one subclass (docker.py, podman.py) that says how it is given NVIDIA GPUs; the rest of a
container's life is here: `<runtime> run -d` with host networking, the model read-only at its
own path, the run dir, exactly the record's GPUs and the transfer path's devices; the
container's identity by its full Id and creation time, so only what an attempt started is ever
removed.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from narwhal.core import launch_record as lr
from narwhal.core.transfer_path import TransferPath
from narwhal.node.engine.errors import RuntimeError_
from narwhal.node.engine.runtimes.base import Ran, Started, chunks, keep_tail

START_TIMEOUT_S = 120
CONTAINER_PREFIX = "narwhal-"


def container_name(record: lr.LaunchRecord) -> str:
    return f"{CONTAINER_PREFIX}{record.engine}"


def hub_blobs_args(record: lr.LaunchRecord) -> list[str]:
    """A Hugging Face cache snapshot's files are links into its repo's blobs/: the container
    gets that folder too, read-only at its own path, or every link would dangle inside it.
    (The probe module is loaded here, at prepare, not by every `narwhal-engine` command.)"""
    from narwhal.node.host_probe import hub_blobs

    blobs = hub_blobs(os.path.realpath(record.model_dir))
    return ["-v", f"{blobs}:{blobs}:ro"] if blobs is not None else []


def transfer_args(path: TransferPath | None) -> list[str]:
    """An RDMA path's device nodes, and the locked memory its registrations need."""
    if path is None or not path.device_nodes:
        return []
    args = [a for node in path.device_nodes for a in ("--device", node)]
    return [*args, "--cap-add", "IPC_LOCK", "--ulimit", "memlock=-1:-1"]


def _timed(argv: list[str], **kwargs: Any) -> tuple[subprocess.CompletedProcess[str], Ran]:
    t0 = time.time()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    return done, [{"argv": argv, "start": t0, "end": time.time(),
                   "exit_status": done.returncode}]


class ContainerRuntime:
    """A container runtime with docker's CLI (podman keeps it); subclasses give GPU flags."""

    contained = True

    def __init__(self, name: str) -> None:
        self.name = name

    def nvidia_args(self, record: lr.LaunchRecord) -> list[str]:
        raise NotImplementedError

    def device_args(self, record: lr.LaunchRecord) -> list[str]:
        """How the runtime is given exactly the record's GPUs. AMD with either runtime:
        /dev/kfd, each GPU's render node, and the video group that owns them (ROCm's
        documented container flags); the container sees only the GPUs whose render nodes it
        was given. NVIDIA: the subclass's way."""
        if record.accelerator == "none":
            return []
        if record.accelerator == "nvidia":
            return self.nvidia_args(record)
        args = ["--device", "/dev/kfd"]
        for d in record.devices:
            args += ["--device", str(d.render_node)]
        return [*args, "--group-add", "video"]

    def visible_devices(self, record: lr.LaunchRecord) -> dict[str, str]:
        return {}

    def container_name(self, record: lr.LaunchRecord) -> str | None:
        return container_name(record)

    def launch_argv(self, record: lr.LaunchRecord, env: dict[str, str],
                    path: TransferPath | None, serve: list[str]) -> list[str]:
        """`docker|podman run -d ...`: host network (the side channel and UCX bind the fabric
        address), the model read-only at its own path, the run dir, exactly the record's GPUs
        and the transfer path's devices. The binary is the launch record's runtime."""
        argv = [record.runtime, "run", "-d", "--name", container_name(record),
                "--network", "host", "--ipc", "host", "--label", f"narwhal.engine={record.engine}",
                "-v", f"{record.model_dir}:{record.model_dir}:ro", *hub_blobs_args(record),
                "-v", f"{record.run_dir}:{record.run_dir}", *self.device_args(record),
                *transfer_args(path)]
        for name in sorted(env):
            argv += ["-e", f"{name}={env[name]}"]
        for name in record.secret_environment:  # passed through from the runtime's environment
            argv += ["-e", name]
        return [*argv, record.image.id, *serve]

    def plan_environment(self, env: dict[str, str]) -> dict[str, str]:
        return {}  # a container's environment is in its argv (secrets by name only)

    def inspect(self, ref: str) -> tuple[str, str, bool] | None:
        """(Id, Created, running) of a container, or None when there is none by that ref."""
        done = subprocess.run([self.name, "inspect", "--type", "container", "--format",
                               "{{.Id}}|{{.Created}}|{{.State.Running}}", ref],
                              capture_output=True, text=True, timeout=60, check=False)
        parts = done.stdout.strip().split("|")
        if done.returncode != 0 or len(parts) != 3:
            return None
        return parts[0], parts[1], parts[2] == "true"

    def start(self, plan: dict[str, Any], env: dict[str, str], log_path: Path,
              owned: frozenset[tuple[str, str]]) -> tuple[Started, Ran]:
        """A container already holding the plan's name is removed first only when its (Id,
        Created) is in `owned`: one the deployment record says an earlier attempt started,
        left behind when this run dir lost track of it (the host was reinstalled or its disk
        restored). Any other container of that name refuses the start, named."""
        ran: Ran = []
        existing = self.inspect(plan["container_name"])
        if existing is not None and existing[:2] in owned:
            ran += _timed([self.name, "rm", "-f", existing[0]], timeout=60)[1]
            existing = self.inspect(plan["container_name"])
        if existing is not None:
            raise RuntimeError_(f"a container named {plan['container_name']} already exists "
                                f"({existing[0][:12]}) and the deployment record does not own "
                                "it; stop it (`narwhal-engine stop`) or remove it")
        done, timed = _timed(plan["argv"], env=env, timeout=START_TIMEOUT_S)
        ran += timed
        if done.returncode != 0:
            raise RuntimeError_(f"{self.name} run exited {done.returncode}: "
                                f"{done.stderr.strip()[-500:]}")
        found = self.inspect(done.stdout.strip())
        if found is None:
            raise RuntimeError_(f"{self.name} run printed {done.stdout.strip()[:80]!r}, which "
                                "it cannot inspect")
        return Started(self.name, found[0], found[1]), ran

    def alive(self, started: Started) -> bool:
        found = self.inspect(started.id)
        return found is not None and found[:2] == (started.id, started.created) and found[2]

    def logs(self, started: Started, log_path: Path) -> str:
        done = subprocess.run([self.name, "logs", started.id], capture_output=True, text=True,
                              timeout=60, check=False)
        return done.stdout + done.stderr

    def log_tail(self, started: Started, log_path: Path, limit: int) -> tuple[bytes, int]:
        """What the runtime keeps of the container's output (`<runtime> logs`, both streams
        as they interleave)."""
        with subprocess.Popen([self.name, "logs", started.id], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
            if proc.stdout is None:
                raise RuntimeError_(f"{self.name} logs gave no output stream")
            got = keep_tail(chunks(proc.stdout), limit)
            proc.wait(timeout=60)
        return got

    def log_source(self, started: Started, log_path: Path) -> str:
        return f"{self.name} logs {started.id}"

    def stop(self, started: Started) -> str:
        found = self.inspect(started.id)
        if found is None:
            return "already gone"
        if found[:2] != (started.id, started.created):
            return "kept: the container with this Id is not the one started"
        subprocess.run([self.name, "rm", "-f", started.id], capture_output=True,
                       timeout=60, check=False)
        return "removed"
