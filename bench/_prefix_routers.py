"""The routers bench/prefix.py compares, each over the same fleet (CacheSetup: bounded prefix
caches, KV events on), each in the cache-aware setting its own documentation recommends.

- narwhal-blind       narwhal-serve as the goodput bench starts it: profiles from the
                      emulators' coefficients, 2 prefill + 2 decode, no cache awareness
- narwhal             the same plus `prefix_cache` (the model's tokenizer) and each engine's
                      `kv_events` endpoint: placement on the engines' own cache state
- narwhal-planner     narwhal (cache-aware) at its best setting for a moving prefill/decode
                      mix: every engine `both`, the pool planner (the goodput bench's PLANNER)
                      sizing the pools from demand
- narwhal-planner-blind  the same planner, no cache awareness
- vllm-router         0.1.17, P/D, `--prefill-policy cache_aware` (its text radix tree, the
                      documented defaults: cache threshold 0.3, balance 64 / 1.5) and
                      `--decode-policy power_of_two` (the --help's P/D example)
- vllm-router-kv      0.1.17, P/D, `--prefill-policy kv_aware` fed by the prefill engines' ZMQ
                      KV events (`--pd-kv-events URL=tcp://...`), decode power_of_two
- sglang-router       0.3.2 in its regular mode, `--policy cache_aware`, over all four engines
                      as aggregated workers: its P/D mode speaks SGLang's bootstrap protocol,
                      which vLLM-style (NIXL) engines do not (see sglang-router-pd)
- sglang-router-pd    0.3.2 `--pd-disaggregation`, cache_aware: kept to record what it does
                      with these engines
- narwhal-inference   0.7.0 at the fixed split, engines pinned; its residency following needs
                      an attestation sidecar per engine (engine_contract), so it routes blind
"""

from __future__ import annotations

from pathlib import Path

from _goodput_fleet import (
    PLANNER,
    Fleet,
    Timing,
    start_narwhal,
    start_narwhal_inference,
    start_vllm_router,
)
from _procs import Owned, free_ports, start, wait_status
from _targets import venv

ROUTERS = ("narwhal-blind", "narwhal", "narwhal-planner-blind", "narwhal-planner", "vllm-router", "vllm-router-kv", "sglang-router",
           "sglang-router-pd", "narwhal-inference", "vllm-router-rr")
DEFAULT_ROUTERS = ("narwhal-blind", "narwhal", "narwhal-planner-blind", "narwhal-planner", "vllm-router", "sglang-router",
                   "narwhal-inference")


def _vllm_router_cache(fleet: Fleet, cpu: str, work: Path, kv_aware: bool) -> Owned:
    """vllm-router in P/D with a cache-aware prefill policy (text tree, or KV events)."""
    root = venv("setup-vllm-router.sh")
    port, metrics_port = free_ports(2)
    name = "vllm-router-kv" if kv_aware else "vllm-router"
    argv = [str(root / "bin" / "vllm-router"), "--vllm-pd-disaggregation"]
    for url in fleet.by_role("prefill"):
        argv += ["--prefill", url, "none"]
    for url in fleet.by_role("decode"):
        argv += ["--decode", url]
    argv += ["--kv-connector", "nixl", "--decode-policy", "power_of_two"]
    if kv_aware:
        argv += ["--prefill-policy", "kv_aware"]
        for i, role in enumerate(fleet.roles):
            if role == "prefill":
                argv += ["--pd-kv-events", f"{fleet.url(i)}=tcp://127.0.0.1:{fleet.kv_ports[i]}"]
    else:
        argv += ["--prefill-policy", "cache_aware", "--cache-threshold", "0.3",
                 "--balance-abs-threshold", "64", "--balance-rel-threshold", "1.5"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
             "--prometheus-port", str(metrics_port), "--log-level", "warning"]
    env = {"VLLM_ROUTER_TOKENIZER": str(fleet.model_dir)} if kv_aware else None
    r = start(name, argv, cpu=cpu, log=work / f"{name}.log", port=port, env=env)
    r.extra["ready_s"] = round(wait_status(port, "/health", 60, r.proc), 3)
    return r


def _sglang_router(fleet: Fleet, cpu: str, work: Path, pd: bool) -> Owned:
    """sglang-router with cache_aware: regular mode over every engine, or its P/D mode."""
    root = venv("setup-sglang-router.sh")
    port, metrics_port = free_ports(2)
    name = "sglang-router-pd" if pd else "sglang-router"
    argv = [str(root / "bin" / "python"), "-m", "sglang_router.launch_router"]
    if pd:
        argv.append("--pd-disaggregation")
        for url in fleet.by_role("prefill"):
            argv += ["--prefill", url, "none"]
        for url in fleet.by_role("decode"):
            argv += ["--decode", url]
    else:
        argv += ["--worker-urls", *[fleet.url(i) for i in range(len(fleet.engines))]]
    argv += ["--policy", "cache_aware", "--cache-threshold", "0.3",
             "--balance-abs-threshold", "64", "--balance-rel-threshold", "1.5",
             "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
             "--prometheus-port", str(metrics_port), "--log-level", "warn"]
    r = start(name, argv, cpu=cpu, log=work / f"{name}.log", port=port)
    r.extra["ready_s"] = round(wait_status(port, "/health", 60, r.proc), 3)
    return r


def start_prefix_router(name: str, fleet: Fleet, timing: Timing, slo: dict[str, float],
                        cpu: str, work: Path) -> Owned:
    if name == "narwhal-blind":
        return start_narwhal(fleet, timing, slo, cpu, work, name)
    if name == "narwhal":
        return start_narwhal(fleet, timing, slo, cpu, work, name, prefix_aware=True)
    if name in ("narwhal-planner", "narwhal-planner-blind"):
        return start_narwhal(fleet, timing, slo, cpu, work, name, flips=PLANNER,
                             prefix_aware=not name.endswith("-blind"))
    if name in ("vllm-router", "vllm-router-kv"):
        return _vllm_router_cache(fleet, cpu, work, kv_aware=name.endswith("-kv"))
    if name in ("sglang-router", "sglang-router-pd"):
        return _sglang_router(fleet, cpu, work, pd=name.endswith("-pd"))
    if name == "narwhal-inference":
        return start_narwhal_inference(fleet, timing, slo, cpu, work)
    if name == "vllm-router-rr":  # the goodput bench's round robin, for reference
        return start_vllm_router(fleet, cpu, work)
    raise ValueError(f"unknown router {name!r}")


def log_tail(path: Path, lines: int = 20) -> str:
    """The end of a router's log, kept in the result when it failed to start."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:])[-3000:]
