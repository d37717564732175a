"""Engine emulators on lab hosts: each in its host's network namespace, reached only from inside.

The root namespace has no route into the lab, so health checks and requests run through
`narwhal.lab.engine.drive` under `ip netns exec` in the workstation namespace. HTTP listens on
the host's management address; the NIXL side channel and the KV block server on its fabric
address, so KV bytes cross the (shapeable) fabric exactly as on a real fleet.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narwhal.lab.engine.testing import write_model_dir
from narwhal.lab.plan import LabPlan
from narwhal.lab.run import LabError, in_netns

MODEL_NAME = "narwhal-lab/tiny-llama"
KV_BOTH = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})


@dataclass
class LabEngine:
    host: str
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def rss_bytes(self) -> int:
        """Resident set of the emulator process (the `ip netns exec` wrapper execs into it)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise LabError(f"emulator on {self.host} (pid {self.process.pid}) has no VmRSS")

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


def drive(plan: LabPlan, *args: str, timeout: float = 120.0, netns: str | None = None,
          engine_key: str | None = None) -> dict[str, Any]:
    """Run the driver in the workstation namespace (or `netns`); its JSON answer. A keyed
    engine's key reaches the driver through its environment."""
    env = {**os.environ, **({"VLLM_API_KEY": engine_key} if engine_key else {})}
    done = subprocess.run(in_netns(netns or plan.ws_netns,
                                   [sys.executable, "-m", "narwhal.lab.engine.drive", *args]),
                          capture_output=True, text=True, timeout=timeout, check=False, env=env)
    if done.returncode != 0:
        raise LabError(f"engine driver `{' '.join(args[:1])}` failed: {done.stderr.strip()[-2000:]}")
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


@contextlib.contextmanager
def emulators(plan: LabPlan, placements: Sequence[tuple[str, int]], log_dir: Path,
              extra_args: Sequence[str] = (), zero_delay: bool = True) -> Iterator[list[LabEngine]]:
    """Start one emulator per (host, port); all healthy or the test fails with their logs.

    `zero_delay=False` runs the emulator's timing model (what profiling and pacing measure)."""
    started: list[LabEngine] = []
    # One model path for every engine, as on a fleet: the --model string is a hash factor, and
    # the hosts' own copies sit under different root-namespace paths.
    model_dir = write_model_dir(log_dir / "model", plan.spec.model.checkpoint_config())
    try:
        for index, (host, port) in enumerate(placements):
            h = plan.host(host)
            env = {**os.environ, "VLLM_NIXL_SIDE_CHANNEL_HOST": h.fabric_ip,
                   "VLLM_NIXL_SIDE_CHANNEL_PORT": str(5600 + index)}
            argv = [sys.executable, "-m", "narwhal.lab.engine", "serve", str(model_dir),
                    "--served-model-name", MODEL_NAME, "--host", h.mgmt_ip, "--port", str(port),
                    "--kv-transfer-config", KV_BOTH,
                    *(["--emu-zero-delay"] if zero_delay else []), *extra_args]
            log_path = log_dir / f"{host}-{port}.log"
            with log_path.open("wb") as log:
                process = subprocess.Popen(in_netns(h.netns, argv), stdout=log,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env=env)
            started.append(LabEngine(host, f"http://{h.mgmt_ip}:{port}", process, log_path))
        health = drive(plan, "health", *(e.url for e in started), "--timeout", "60")
        if health["pending"]:
            logs = "\n".join(f"--- {e.host} {e.url}\n{e.log_path.read_text()[-2000:]}"
                             for e in started if e.url in health["pending"])
            raise LabError(f"emulators not healthy within 60 s: {health['pending']}\n{logs}")
        yield started
    finally:
        for engine in started:
            engine.stop()
