"""Engines and routers for the goodput bench: four timed emulators, three routers over them.

Every engine runs the same realistic timing model (`Timing`), so each router's cost model can be
written from the coefficients the emulators really use, not guessed or profiled:

- Narwhal's profile store (narwhal.profiles v1): prefill a + b*n + c*n^2, decode step
  base + per_token*resident + per_request*running, bound to each engine's live generation.
- narwhal-inference 0.7.0's profiles (its v1 rows): ttft_c + ttft_b*n + ttft_a*n^2 and
  tpot_intercept + tpot_slope*resident, bound to its generation digest of the same engine.
- vllm-router 0.1.17 has no cost model: round_robin over the prefill and decode lists.
- `narwhal-profiled`: Narwhal's store measured instead, by narwhal-profile against the idle
  emulators (the product's own path, Gate F), so the row shows what the router does with the
  curves an operator would really have.

All three get the same split: the first half of the engines prefill, the rest decode.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _procs import Owned, free_port, free_ports, http_status, start, wait_status
from _targets import KV_BOTH, REPO, launch_narwhal_inference, venv

sys.path.insert(0, str(REPO / "scripts" / "baselines"))
from narwhal_inference_fleet import engine_generation

KV_CAPACITY_TOKENS = 200_000  # 256 MiB of KV at 1 KiB per token (tiny llama, float32)


@dataclass(frozen=True)
class Timing:
    """The emulators' timing model, in seconds (see docs/engine-emulator.md)."""

    prefill_a: float = 0.005
    prefill_b: float = 3.0e-5
    prefill_c: float = 5.0e-9
    decode_base: float = 0.010
    decode_per_token: float = 1.0e-7
    decode_per_request: float = 4.0e-4
    max_num_seqs: int = 64

    def flags(self) -> list[str]:
        return ["--emu-prefill-a", str(self.prefill_a), "--emu-prefill-b", str(self.prefill_b),
                "--emu-prefill-c", str(self.prefill_c), "--emu-decode-base", str(self.decode_base),
                "--emu-decode-per-token", str(self.decode_per_token),
                "--emu-decode-per-request", str(self.decode_per_request),
                "--max-num-seqs", str(self.max_num_seqs)]


@dataclass(frozen=True)
class CacheSetup:
    """Prefix-cache geometry for bench/prefix.py: a bounded cache per engine (`num_blocks` of
    `block_size` tokens, so a trace does not fit in one engine), vLLM's ZMQ KV events on a
    port per engine, and VLLM_SERVER_DEV_MODE=1 for POST /reset_prefix_cache between rows."""

    num_blocks: int
    block_size: int = 16
    max_model_len: int = 2048
    platform: str = "cuda"  # the emulated CPU_ATTN takes only multiples of 32 tokens a block


@dataclass
class Fleet:
    model: str
    engines: list[Owned]
    roles: list[str]
    model_dir: Path | None = None
    kv_ports: list[int] = field(default_factory=list)  # each engine's KV event port (CacheSetup)

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.engines[i].port}"

    def by_role(self, role: str) -> list[str]:
        return [self.url(i) for i, r in enumerate(self.roles) if r == role]


def _engine_argv(model_dir: Path, port: int, timing: Timing, cache: CacheSetup | None,
                 kv_port: int) -> list[str]:
    argv = [sys.executable, "-m", "narwhal.lab.engine", "serve", str(model_dir),
            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny",
            "--kv-transfer-config", KV_BOTH, "--emu-platform", cache.platform if cache else "cpu",
            "--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", "256M",
            "--max-model-len", str(cache.max_model_len if cache else 2048),
            "--emu-eos-probability", "0", *timing.flags()]
    if cache is not None:
        events = {"enable_kv_cache_events": True, "publisher": "zmq",
                  "endpoint": f"tcp://*:{kv_port}", "topic": ""}
        argv += ["--block-size", str(cache.block_size), "--num-gpu-blocks-override",
                 str(cache.num_blocks), "--kv-events-config", json.dumps(events)]
    return argv


def start_fleet(n: int, timing: Timing, cpu: str, work: Path,
                cache: CacheSetup | None = None) -> Fleet:
    from narwhal.lab.engine.testing import write_tiny_llama

    model_dir = write_tiny_llama(work / "tiny")
    owned: list[Owned] = []
    kv_ports: list[int] = []
    try:
        # each engine's HTTP port and NIXL side channel (and KV event port, with `cache`)
        per = 3 if cache else 2
        ports = free_ports(per * n)
        for i in range(n):
            port, side = ports[per * i], ports[per * i + 1]
            kv_port = ports[per * i + 2] if cache else 0
            env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                   "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)}
            if cache:
                env["VLLM_SERVER_DEV_MODE"] = "1"
                kv_ports.append(kv_port)
            argv = _engine_argv(model_dir, port, timing, cache, kv_port)
            engine = start(f"engine-e{i}", argv, cpu=cpu, log=work / f"e{i}.log", port=port,
                           env=env, cwd=REPO)
            engine.extra.update(argv=argv, env=env, cpu=cpu)  # to start it again (_kills.py)
            owned.append(engine)
        for eng in owned:
            wait_status(eng.port, "/health", 90, eng.proc)
    except BaseException:
        for eng in owned:
            eng.stop()
        raise
    roles = ["prefill" if i < n // 2 else "decode" for i in range(n)]
    return Fleet("tiny", owned, roles, model_dir, kv_ports)


def _live_generation(url: str) -> dict[str, Any]:
    import urllib.request

    from narwhal.core.profiles import Generation
    from narwhal.serve.router.scheduling.generation import parse_start_time, parse_version

    with urllib.request.urlopen(f"{url}/version", timeout=5) as r:  # noqa: S310 - loopback
        version = r.read()
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:  # noqa: S310 - loopback
        metrics = r.read()
    gen = Generation(engine_version=parse_version(version),
                     process_start_time_seconds=parse_start_time(metrics))
    return dict(gen.model_dump())


def narwhal_profiles(fleet: Fleet, timing: Timing) -> dict[str, Any]:
    rows = []
    for i in range(len(fleet.engines)):
        rows.append({
            "engine_id": f"e{i}", "generation": _live_generation(fleet.url(i)),
            "prefill": {"a_s": timing.prefill_a, "b_s_per_token": timing.prefill_b,
                        "c_s_per_token2": timing.prefill_c, "fit_error": 0.01,
                        "loo_error": 0.01, "samples": 12, "max_prompt_tokens": 2048},
            "decode": {"base_s": timing.decode_base, "per_token_s": timing.decode_per_token,
                       "per_request_s": timing.decode_per_request, "fit_error": 0.01,
                       "loo_error": 0.01, "samples": 24, "max_requests": timing.max_num_seqs,
                       "max_resident_tokens": KV_CAPACITY_TOKENS},
            "measured_at": "2026-11-30T12:00:00+00:00"})
    return {"schema": "narwhal.profiles", "schema_version": 1, "model": fleet.model,
            "profiles": rows}


# narwhal-flips: every engine kv_both, the reactive controller moves them between the pools.
ROLE_FLIPS = {"interval_s": 0.5, "high_water": 0.6, "low_water": 0.3, "cooldown_s": 5.0,
              "min_prefill": 1, "min_decode": 1}
# narwhal-planner: the same engines, pools sized from the demand of the last 3 s.
PLANNER = {"mode": "planner", "interval_s": 0.5, "window_s": 3.0, "cooldown_s": 2.0,
           "min_prefill": 1, "min_decode": 1}


def start_narwhal(fleet: Fleet, timing: Timing, slo: dict[str, float], cpu: str,
                  work: Path, name: str = "narwhal", flips: dict[str, object] | None = None,
                  profiled: bool = False, prefix_aware: bool = False,
                  serving: dict[str, object] | None = None) -> Owned:
    """Narwhal over the fleet; `prefix_aware` adds cache-aware placement (the fleet's
    tokenizer and each engine's KV event endpoint; needs a fleet started with CacheSetup);
    `serving` is the fleet's serving block (none: the router's defaults, as goodput.py runs
    it), e.g. Gate D's `handoff_budget_s` for bench/kv_release.py."""
    folder = work / name
    folder.mkdir(exist_ok=True)
    if not profiled:
        (folder / "profiles.json").write_text(json.dumps(narwhal_profiles(fleet, timing),
                                                         indent=1))
    engines: list[dict[str, object]] = [
        {"id": f"e{i}", "url": fleet.url(i), "role": "both" if flips else role}
        for i, role in enumerate(fleet.roles)]
    if prefix_aware:
        for entry, kv_port in zip(engines, fleet.kv_ports, strict=True):
            entry["kv_events"] = {"endpoint": f"tcp://127.0.0.1:{kv_port}", "topic": ""}
    doc: dict[str, object] = {
        "schema": "narwhal.fleet", "schema_version": 1, "model": fleet.model,
        "engines": engines, "slo": slo, "journal": {"path": str(folder / "journal.jsonl")},
        "profiles": {"path": str(folder / "profiles.json")}}
    if flips:
        doc["role_flips"] = flips
    if serving:
        doc["serving"] = serving
    if prefix_aware:
        doc["prefix_cache"] = {"tokenizer_dir": str(fleet.model_dir)}
    (folder / "fleet.json").write_text(json.dumps(doc, indent=1))
    if profiled:
        profile = Path(sys.executable).parent / "narwhal-profile"
        with (folder / "profile.json").open("w") as out, \
                (work / f"{name}-profile.log").open("w") as log:
            subprocess.run([str(profile), "--fleet", str(folder / "fleet.json"), "--json"],
                           check=True, timeout=600, stdout=out, stderr=log)
    port = free_port()
    serve = Path(sys.executable).parent / "narwhal-serve"
    r = start(name, [str(serve), "--fleet", str(folder / "fleet.json"), "--port", str(port)],
              cpu=cpu, log=work / f"{name}.log", port=port)
    r.extra["ready_s"] = round(wait_status(port, "/ready", 30, r.proc), 3)
    return r


def _nwi_row(iid: str, url: str, timing: Timing) -> dict[str, Any]:
    # 0.7.0's decode model has the same three terms as the emulator's: a base, a per-token
    # slope and a per-request slope (`tpot_request_slope`, profiling/model.py there). An
    # earlier version of this bench folded the per-request term into the intercept, which put
    # the intercept above the TPOT SLO: narwhal-inference then priced decode capacity at zero
    # and its controller never moved a role. Its own preflight refuses such rows.
    return {"iid": iid, "generation_digest": engine_generation(url),
            "ttft_a": timing.prefill_c, "ttft_b": timing.prefill_b, "ttft_c": timing.prefill_a,
            "tpot_slope": timing.decode_per_token, "tpot_intercept": timing.decode_base,
            "tpot_request_slope": timing.decode_per_request,
            "kv_capacity_tokens": KV_CAPACITY_TOKENS, "decode_min_requests": 1,
            "decode_max_requests": timing.max_num_seqs, "decode_min_kv_tokens": 1,
            "decode_max_kv_tokens": KV_CAPACITY_TOKENS, "decode_fit_mape": 0.0,
            "decode_cv_mape": 0.0, "prefill_min_tokens": 1, "prefill_max_tokens": 2048,
            "decode_min_output_tokens": 1, "decode_max_output_tokens": 2048}


# narwhal-inference 0.7.0's reactive role controller as its own shipped fleets tune it (the
# `controller` block of dev/reference-v1.json and dev/small-cuda*.json in its wheel): its code
# defaults (a 120 s demand window, 5 s steps, 60 s of evidence before a move) cannot react
# within a 30 s phase. The controller runs whenever engines are not pinned; there is no flag.
NWI_CONTROLLER = {
    "advisory": False, "monitor_interval_s": 0.1, "min_prefill": 1, "min_decode": 1,
    "thresholds": {"expand": 1.0, "shrink": 0.5, "cooldown_s": 10.0, "dwell_s": 0.0,
                   "sustained_intervals": 3, "panic_ratio": 0.0, "flip_resident_guard": 0},
    "reactive": {"window_s": 30.0, "step_s": 0.25, "confirmations": 2, "utilization": 0.8,
                 "min_arrivals": 10, "demand_floor": 0.2, "movement_margin": 0.05,
                 "evidence_span_s": 15.0, "evidence_max_span_s": 30.0,
                 "evidence_min_arrivals": 10, "demand_rise_tolerance": 0.25}}


def start_narwhal_inference(fleet: Fleet, timing: Timing, slo: dict[str, float], cpu: str,
                            work: Path, controller: bool = False,
                            first_token_timeout_s: float = 30.0) -> Owned:
    """narwhal-inference at the fixed 2+2 split (every engine pinned), or with its reactive
    role controller on (`controller`: unpinned, its shipped tuning). `first_token_timeout_s`
    is its engine.first_token_timeout_s, 30 s as goodput.py has always run it (its own
    default is 2.5 s, which it asks to calibrate with narwhal-check --calibrate-first-token);
    bench/kv_release.py can run it at another."""
    root = venv("setup-narwhal-inference.sh")
    folder = (work / ("nwi-controller" if controller else "nwi")).resolve()
    folder.mkdir(exist_ok=True)
    doc = {"schema": "narwhal.fleet", "schema_version": 2, "model": fleet.model,
           "engines": [{"iid": f"e{i}", "url": fleet.url(i), "role": role,
                        "pin": not controller} for i, role in enumerate(fleet.roles)],
           "slo": slo, "engine": {"first_token_timeout_s": first_token_timeout_s},
           "profiles": {"path": str(folder / "profiles.json")},
           "recovery": {"state_path": str(folder / "state.json")},
           **({"controller": NWI_CONTROLLER} if controller else {})}
    (folder / "fleet.json").write_text(json.dumps(doc, indent=2))
    (folder / "profiles.json").write_text(json.dumps(nwi_profiles(fleet, timing), indent=2))
    return launch_narwhal_inference(root, folder, cpu, work)


def nwi_profiles(fleet: Fleet, timing: Timing) -> dict[str, Any]:
    """narwhal-inference's profile store for the fleet's live generations."""
    rows = [_nwi_row(f"e{i}", fleet.url(i), timing) for i in range(len(fleet.engines))]
    return {"schema": "narwhal.profiles", "schema_version": 1,
            "meta": {"writer": "narwhal bench/goodput.py", "measured": False},
            "profiles": rows}


def start_vllm_router(fleet: Fleet, cpu: str, work: Path) -> Owned:
    root = venv("setup-vllm-router.sh")
    port, metrics_port = free_ports(2)
    argv = [str(root / "bin" / "vllm-router"), "--vllm-pd-disaggregation"]
    for url in fleet.by_role("prefill"):
        argv += ["--prefill", url, "none"]
    for url in fleet.by_role("decode"):
        argv += ["--decode", url]
    argv += ["--kv-connector", "nixl", "--policy", "round_robin", "--host", "127.0.0.1",
             "--port", str(port), "--prometheus-host", "127.0.0.1",
             "--prometheus-port", str(metrics_port), "--log-level", "warning"]
    r = start("vllm-router", argv, cpu=cpu, log=work / "vllm-router.log", port=port)
    r.extra["ready_s"] = round(wait_status(port, "/health", 60, r.proc), 3)
    return r


def start_router(name: str, fleet: Fleet, timing: Timing, slo: dict[str, float], cpu: str,
                 work: Path) -> Owned:
    if name == "narwhal":
        return start_narwhal(fleet, timing, slo, cpu, work)
    if name == "narwhal-profiled":
        return start_narwhal(fleet, timing, slo, cpu, work, name, profiled=True)
    if name == "narwhal-flips":
        return start_narwhal(fleet, timing, slo, cpu, work, name, flips=ROLE_FLIPS)
    if name == "narwhal-planner":
        return start_narwhal(fleet, timing, slo, cpu, work, name, flips=PLANNER)
    if name == "narwhal-inference":
        return start_narwhal_inference(fleet, timing, slo, cpu, work)
    if name == "narwhal-inference-controller":
        return start_narwhal_inference(fleet, timing, slo, cpu, work, controller=True)
    if name == "vllm-router":
        return start_vllm_router(fleet, cpu, work)
    raise ValueError(f"unknown router {name!r}")



def tokenize_count(port: int, model: str, prompt: str) -> int:
    """Prompt tokens as the engines count them (POST /tokenize)."""
    status, body = http_status(port, "/tokenize", "POST",
                               json.dumps({"model": model, "prompt": prompt}).encode())
    if status != 200:
        raise RuntimeError(f"/tokenize answered {status}: {body[:200]!r}")
    return int(json.loads(body)["count"])
