"""The engines and the routers under test, each started pinned and checked before it is measured.

Engines: two zero-delay engines, `p0` (prefill) and `d0` (decode), pinned to the client core:
Narwhal's engine emulator (`--emu-zero-delay`) or, when asked, the reference kit's stub.
Routers, each pinned to the router core, all over the same two engines:

- narwhal           this repository's narwhal-serve (prompt length from the prefill leg's usage)
- narwhal-tokenize  the same router with serving.prompt_length "tokenize" (one /tokenize per request)
- narwhal-base      the same router from another checkout's src (NARWHAL_BENCH_BASE_SRC, its
                    compiled modules built in place): a change against its base, in one run
- narwhal-inference 0.7.0's narwhal-serve at --log-level warning (its cheapest setting)
- vllm-router       0.1.17 in --vllm-pd-disaggregation mode, round_robin, --log-level warning
- floor             bench/_floor_relay.py: the bare two-leg relay on uvloop, none of a router's
                    work; the CPU per request no router built on uvloop can go below here
- direct            no router: the client talks to the decode engine (one leg), for added latency
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from _procs import Owned, free_port, free_ports, http_status, start, wait_status

REPO = Path(__file__).resolve().parents[1]
KIT_STUB = Path("/work/shared/reference/baseline-kit/stub_engine.py")
KV_BOTH = '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"cpu"}'


@dataclass
class Engines:
    kind: str
    model: str
    prefill: Owned
    decode: Owned

    def urls(self) -> tuple[str, str]:
        return f"http://127.0.0.1:{self.prefill.port}", f"http://127.0.0.1:{self.decode.port}"


def venv(script: str) -> Path:
    """A baseline venv from scripts/baselines (cached after the first build)."""
    out = subprocess.run([str(REPO / "scripts" / "baselines" / script)], capture_output=True,
                         text=True, check=True)
    return Path(out.stdout.strip().splitlines()[-1])


def start_engines(kind: str, cpu: str, work: Path, stub_python: Path | None) -> Engines:
    owned: list[Owned] = []
    if kind == "emulator":
        from narwhal.lab.engine.testing import write_tiny_llama

        model_dir = write_tiny_llama(work / "tiny")
        ports = free_ports(4)  # each engine's HTTP port and NIXL side channel
        for i, name in enumerate(("p0", "d0")):
            port, side = ports[2 * i], ports[2 * i + 1]
            argv = [sys.executable, "-m", "narwhal.lab.engine", "serve", str(model_dir),
                    "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny",
                    "--kv-transfer-config", KV_BOTH, "--emu-platform", "cpu",
                    "--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", "256M",
                    "--emu-zero-delay", "--emu-eos-probability", "0"]
            env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                   "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)}
            owned.append(start(f"engine-{name}", argv, cpu=cpu, log=work / f"{name}.log",
                               port=port, env=env, cwd=REPO))
        model = "tiny"
    else:
        assert stub_python is not None
        for name in ("p0", "d0"):
            port = free_port()
            owned.append(start(f"engine-{name}", [str(stub_python), str(KIT_STUB), "--port",
                                                  str(port), "--engine-id", f"stub-{name}"],
                               cpu=cpu, log=work / f"{name}.log", port=port))
        model = "stub-model"
    for eng in owned:
        wait_status(eng.port, "/health", 60, eng.proc)
    return Engines(kind, model, owned[0], owned[1])


def _narwhal(name: str, engines: Engines, cpu: str, work: Path, tokenize: bool,
             src: str = "") -> Owned:
    p, d = engines.urls()
    doc = {
        "schema": "narwhal.fleet", "schema_version": 1, "model": engines.model,
        "engines": [{"id": "p0", "url": p, "role": "prefill"},
                    {"id": "d0", "url": d, "role": "decode"}],
        "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
        "serving": {"prompt_length": "tokenize" if tokenize else "prefill_usage"},
        "journal": {"path": str(work / f"{name}-journal.jsonl")},
    }
    fleet = work / f"{name}-fleet.json"
    fleet.write_text(json.dumps(doc, indent=1))
    port = free_port()
    serve = Path(sys.executable).parent / "narwhal-serve"
    r = start(name, [str(serve), "--fleet", str(fleet), "--port", str(port)], cpu=cpu,
              log=work / f"{name}.log", port=port, env={"PYTHONPATH": src} if src else None)
    r.extra["ready_s"] = round(wait_status(port, "/ready", 30, r.proc), 3)
    return r


def _narwhal_inference(engines: Engines, cpu: str, work: Path) -> Owned:
    root = venv("setup-narwhal-inference.sh")
    folder = work / "nwi"
    writer = REPO / "scripts" / "baselines" / "narwhal_inference_fleet.py"
    p, d = engines.urls()
    subprocess.run([sys.executable, str(writer), "fleet", "--model", engines.model, "--prefill", p,
                    "--decode", d, "--dir", str(folder)], check=True, capture_output=True)
    subprocess.run([sys.executable, str(writer), "profiles", "--fleet", str(folder / "fleet.json")],
                   check=True, capture_output=True)
    return launch_narwhal_inference(root, folder, cpu, work)


def launch_narwhal_inference(root: Path, folder: Path, cpu: str, work: Path) -> Owned:
    """narwhal-inference's router on the fleet and profiles already written in `folder`."""
    port = free_port()
    r = start("narwhal-inference", [str(root / "bin" / "narwhal-serve"), "--fleet",
                                    str(folder / "fleet.json"), "--host", "127.0.0.1",
                                    "--port", str(port), "--log-level", "warning"],
              cpu=cpu, log=work / "narwhal-inference.log", port=port, cwd=folder)
    r.extra["ready_s"] = round(wait_status(port, "/ready", 60, r.proc), 3)
    return r


def _floor(engines: Engines, cpu: str, work: Path) -> Owned:
    p, d = engines.urls()
    port = free_port()
    r = start("floor", [sys.executable, str(Path(__file__).with_name("_floor_relay.py")), p, d,
                        str(port)], cpu=cpu, log=work / "floor.log", port=port)
    r.extra["ready_s"] = round(wait_status(port, "/health", 30, r.proc), 3)
    return r


def _vllm_router(engines: Engines, cpu: str, work: Path) -> Owned:
    root = venv("setup-vllm-router.sh")
    p, d = engines.urls()
    port = free_port()
    argv = [str(root / "bin" / "vllm-router"), "--vllm-pd-disaggregation", "--prefill", p, "none",
            "--decode", d, "--kv-connector", "nixl", "--policy", "round_robin",
            "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(free_port()), "--log-level", "warning"]
    r = start("vllm-router", argv, cpu=cpu, log=work / "vllm-router.log", port=port)
    r.extra["ready_s"] = round(wait_status(port, "/health", 60, r.proc), 3)
    return r


def start_router(name: str, engines: Engines, cpu: str, work: Path) -> Owned:
    if name == "narwhal":
        return _narwhal(name, engines, cpu, work, tokenize=False)
    if name == "narwhal-tokenize":
        return _narwhal(name, engines, cpu, work, tokenize=True)
    if name == "narwhal-base":
        src = os.environ.get("NARWHAL_BENCH_BASE_SRC", "")
        if not Path(src, "narwhal").is_dir():
            raise ValueError("narwhal-base needs NARWHAL_BENCH_BASE_SRC: another checkout's "
                             "src folder, its compiled modules built in place (setup.py "
                             "build_ext --inplace)")
        return _narwhal(name, engines, cpu, work, tokenize=False, src=src)
    if name == "narwhal-inference":
        return _narwhal_inference(engines, cpu, work)
    if name == "vllm-router":
        return _vllm_router(engines, cpu, work)
    if name == "floor":
        return _floor(engines, cpu, work)
    raise ValueError(f"unknown router {name!r}")


def smoke(port: int, model: str, max_tokens: int) -> None:
    """One streamed request must come back 200 with max_tokens text events and [DONE]."""
    body = json.dumps({"model": model, "prompt": "hello there", "max_tokens": max_tokens,
                       "stream": True}).encode()
    status, data = http_status(port, "/v1/completions", "POST", body, timeout=30)
    events = [ln for ln in data.decode().splitlines() if ln.startswith("data: ")]
    if status != 200 or events[-1:] != ["data: [DONE]"] or len(events) - 1 != max_tokens:
        raise RuntimeError(f"smoke request on :{port} failed: {status} {data[:400]!r}")
