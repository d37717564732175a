"""Settle one engine's configuration once, at startup: flags, environment and model directory.

`parse_config(argv, env)` returns a frozen `EngineConfig`; nothing on the request path reads
argv or the environment again. The NIXL side reads the fields documented on `EngineConfig`
(connector config, side channel, engine id, names, version, KV scale) and the live fault flags
on `EngineFaults` (faults.py).
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from narwhal.core.kv.events import EventsConfig
from narwhal.core.launch_record import ENGINE_API_KEY_ENV
from narwhal.lab.engine.flags import DTYPE_ALIASES, NIXL_CONNECTORS, build_parser, normalize_argv

DEFAULT_VLLM_VERSION = "0.32.0"
DEFAULT_SIDE_CHANNEL_HOST = "localhost"
DEFAULT_SIDE_CHANNEL_PORT = 5600
ADMIN_TOKEN_ENV = "NARWHAL_EMU_ADMIN_TOKEN"  # noqa: S105 - the variable name, not a secret
GIB = 2**30


class StartupError(Exception):
    """The engine cannot start; the message names the flag or file and is printed as is."""


@dataclass(frozen=True)
class TimingOverrides:
    """Per-flag overrides of the timing profile (None = keep the profile's value)."""

    prefill_a: float | None = None
    prefill_b: float | None = None
    prefill_c: float | None = None
    decode_base: float | None = None
    decode_per_token: float | None = None
    decode_per_request: float | None = None


@dataclass(frozen=True)
class EmulatorOptions:
    """The `--emu-*` flags: what the emulator pretends and how fast it is."""

    vllm_version: str = DEFAULT_VLLM_VERSION
    platform: str = "cuda"
    device_memory: int | None = None
    timing_profile: Path | None = None
    zero_delay: bool = False
    timing: TimingOverrides = field(default_factory=TimingOverrides)
    kv_scale: float = 1.0
    eos_probability: float = 1 / 256
    admin_token: str | None = field(default=None, repr=False)
    connector_factory: str = "narwhal.lab.engine.nixl.connector:make_connector"


@dataclass(frozen=True)
class ServeOptions:
    """vLLM flags that shape serving but not the KV plan."""

    host: str | None
    port: int
    api_key: str | None = field(repr=False)
    max_num_seqs: int
    max_num_batched_tokens: int | None
    max_model_len: int | None
    max_logprobs: int
    stream_interval: int
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None
    num_gpu_blocks_override: int | None
    enforce_eager: bool
    access_log: bool
    request_id_headers: bool
    response_role: str
    seed: int


@dataclass(frozen=True)
class EngineConfig:
    """One emulated engine, settled at startup.

    Fields the NIXL side reads:
      model                 the --model string verbatim (a compatibility-hash factor)
      model_dir             the directory config.json was read from
      served_model_names    names the API answers to; the first is the metrics `model_name`
      vllm_version          the version emulated (/version and the hash)
      kv_transfer_config    the parsed --kv-transfer-config object, or None
      engine_id             kv_transfer_config.engine_id, else a fresh uuid4 (as vLLM)
      side_channel_host/port  VLLM_NIXL_SIDE_CHANNEL_HOST/PORT (defaults localhost/5600)
      ucx_env               every UCX_* variable of the environment
      kv_scale              factor on KV bytes moved over the fabric (1.0 = real sizes)
      data_parallel_rank    --data-parallel-rank (default 0)
    """

    model: str
    model_dir: Path
    served_model_names: tuple[str, ...]
    vllm_version: str
    kv_transfer_config: Mapping[str, Any] | None
    engine_id: str
    side_channel_host: str
    side_channel_port: int
    ucx_env: Mapping[str, str]
    kv_scale: float
    args: argparse.Namespace = field(repr=False)  # holds --api-key: never printed
    serve: ServeOptions
    emu: EmulatorOptions
    env: Mapping[str, str] = field(repr=False)

    @property
    def data_parallel_rank(self) -> int:
        """Added to the side-channel port by the NIXL side (one port per engine core)."""
        return int(self.args.data_parallel_rank)

    @property
    def kv_role(self) -> str | None:
        return None if self.kv_transfer_config is None else self.kv_transfer_config.get("kv_role")

    @property
    def transfer_mode(self) -> str:
        connector = (self.kv_transfer_config or {}).get("kv_connector")
        return NIXL_CONNECTORS.get(str(connector), "pull")

    @property
    def kv_events(self) -> EventsConfig | None:
        """The --kv-events-config when it publishes (vLLM's rule), else None."""
        config = self.args.kv_events_config
        return config if isinstance(config, EventsConfig) and config.publishes else None

    @property
    def kv_load_failure_policy(self) -> str:
        return str((self.kv_transfer_config or {}).get("kv_load_failure_policy", "fail"))

    @property
    def dtype(self) -> str:
        dtype = str(self.args.dtype)
        return DTYPE_ALIASES.get(dtype, dtype)


def parse_config(argv: list[str], env: Mapping[str, str]) -> EngineConfig:
    """Parse `[serve] MODEL [flags]`; argparse exits 2 on a bad flag, StartupError otherwise."""
    argv = list(argv)
    if argv and argv[0] == "serve":
        argv = argv[1:]
    parser = build_parser()
    args = parser.parse_args(normalize_argv(argv))
    model = args.model_tag or args.model
    if args.model_tag and args.model and args.model_tag != args.model:
        parser.error(f"argument --model: {args.model!r} conflicts with the positional model "
                     f"{args.model_tag!r}; give one")
    if not model:
        parser.error("the model is required: `serve MODEL_DIR` or --model MODEL_DIR")
    if args.emu_timing_profile is not None and not Path(args.emu_timing_profile).is_file():
        parser.error(f"argument --emu-timing-profile: no such file: {args.emu_timing_profile}")
    model_dir = Path(model).expanduser()
    if not (model_dir / "config.json").is_file():
        raise StartupError(
            f"argument --model: {model!r} has no config.json (the emulator reads the model's "
            "config.json from a local directory; no hub downloads)")
    kv_config = args.kv_transfer_config
    return EngineConfig(
        model=model, model_dir=model_dir,
        served_model_names=tuple(args.served_model_name or [model]),
        vllm_version=args.emu_vllm_version or DEFAULT_VLLM_VERSION,
        kv_transfer_config=kv_config,
        engine_id=str((kv_config or {}).get("engine_id") or uuid.uuid4()),
        side_channel_host=env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", DEFAULT_SIDE_CHANNEL_HOST),
        side_channel_port=_side_channel_port(parser, env),
        ucx_env={k: v for k, v in env.items() if k.startswith("UCX_")},
        kv_scale=args.emu_kv_scale, args=args, serve=_serve(args, env), emu=_emu(args, env),
        env=dict(env),
    )


def _side_channel_port(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> int:
    raw = env.get("VLLM_NIXL_SIDE_CHANNEL_PORT", str(DEFAULT_SIDE_CHANNEL_PORT))
    try:
        port = int(raw)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        parser.error(f"environment VLLM_NIXL_SIDE_CHANNEL_PORT={raw!r} is not a TCP port")
    return port


def _serve(args: argparse.Namespace, env: Mapping[str, str]) -> ServeOptions:
    # vLLM takes its API key from --api-key, else from the environment (VLLM_API_KEY)
    api_key = args.api_key or env.get(ENGINE_API_KEY_ENV) or None
    return ServeOptions(
        host=args.host, port=args.port, api_key=api_key, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
        max_logprobs=args.max_logprobs, stream_interval=args.stream_interval,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        enforce_eager=args.enforce_eager, access_log=not args.disable_uvicorn_access_log,
        request_id_headers=args.enable_request_id_headers, response_role=args.response_role,
        seed=args.seed,
    )


def _emu(args: argparse.Namespace, env: Mapping[str, str]) -> EmulatorOptions:
    return EmulatorOptions(
        vllm_version=args.emu_vllm_version or DEFAULT_VLLM_VERSION,
        platform=args.emu_platform, device_memory=args.emu_device_memory,
        timing_profile=Path(args.emu_timing_profile) if args.emu_timing_profile else None,
        zero_delay=args.emu_zero_delay,
        timing=TimingOverrides(
            prefill_a=args.emu_prefill_a, prefill_b=args.emu_prefill_b,
            prefill_c=args.emu_prefill_c, decode_base=args.emu_decode_base,
            decode_per_token=args.emu_decode_per_token,
            decode_per_request=args.emu_decode_per_request),
        kv_scale=args.emu_kv_scale, eos_probability=min(args.emu_eos_probability, 1.0),
        admin_token=args.emu_admin_token or env.get(ADMIN_TOKEN_ENV) or None,
        connector_factory=args.emu_connector_factory,
    )
