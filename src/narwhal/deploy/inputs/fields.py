"""Field types of the `.env` vocabulary: each parses a string and says how to fix a bad one.

The checks live in pydantic annotated types so one model validates a whole engine at once and
every error comes back with the field it belongs to.
"""

from __future__ import annotations

import math
import re
from pathlib import PurePosixPath
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

from narwhal.core.fleet import KV_CANARY_INTERVAL_RANGE_S, KV_CANARY_INTERVAL_S
from narwhal.core.gpu_sharing import canonical_spelling
from narwhal.deploy.inputs import hostnames, jsonfields, refs, urls

# Characters a shell would treat specially. Values that end up in remote argv are quoted in one
# place anyway; refusing these catches pasted fragments of shell that were never meant as values.
SHELL_META = set(";|&$`<>(){}[]'\"\\*?!#~\n\t ")
IMAGE_RE = re.compile(r"(?:sha256:[0-9a-f]{64}|[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64})")
REVISION_RE = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
IFACE_RE = re.compile(r"[A-Za-z0-9_.:-]{1,15}")
MODEL_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]{0,199}")
GPU_UUID_RE = re.compile(r"GPU-[0-9a-fA-F-]{8,64}")
DEPLOYMENT_RE = re.compile(r"[a-z][a-z0-9-]{0,62}")
SHA256_RE = re.compile(r"[0-9a-f]{64}")
# A decimal number as people write one: no '_' separators, no non-ASCII digits (float() would
# read "1_0" as 10 and "١" as 1), no hex.
DECIMAL_RE = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]{1,3})?")
MAX_DIGITS = 18
# The canary's period, bounded as the fleet's kv_canary.interval_s is (core/fleet.KvCanaryRef),
# so a value the .env accepts is one the router accepts.
CANARY_MIN_S, CANARY_MAX_S = KV_CANARY_INTERVAL_RANGE_S

# How to fix each field, shown beside the problem.
FIXES: dict[str, str] = {
    "hub_endpoint": "give the hub's address, e.g. https://huggingface.co or http://10.0.0.5:8600",
    "engine_image": "pin the image by ID (sha256:<64 hex>) or digest (<name>@sha256:<64 hex>)",
    "model_name": "use the model name the engines serve, e.g. Qwen/Qwen2.5-0.5B-Instruct",
    "model_dir": "give an absolute path on the engine host without shell characters",
    "run_dir": "give an absolute path on the engine host without shell characters",
    "fabric_interface": "name the fabric network interface as `ip link` shows it, e.g. eth1",
    "engine_port": "use a TCP port number from 1 to 65535",
    "attest_port": "use a TCP port number from 1 to 65535",
    "nixl_side_channel_port": "use a TCP port number from 1 to 65535",
    "kv_events_port": "use a TCP port number from 1 to 65535 (the engine publishes its KV "
                      "cache events there), or delete the line to publish none",
    "ucx_tcp_port_range": "write LOW-HIGH with 1 <= LOW <= HIGH <= 65535, e.g. 30000-30100",
    "gpu_ids": "list GPU indices or NVIDIA UUIDs separated by commas, e.g. 0,1",
    "tensor_parallel_size": "use a whole number >= 1, at most the GPUs of the engine",
    "model_dtype": "use bfloat16 or float16",
    "block_size": "use a power of two from 1 to 1024 (vLLM's default is 16; Narwhal's 128)",
    "engine_args": 'write a JSON array of strings, e.g. ["--max-num-seqs","8"]',
    "engine_env": 'write a JSON object of string values, e.g. {"VLLM_LOGGING_LEVEL":"INFO"}',
    "transfer_transport": "use ucx_tcp or ucx_rdma",
    "transfer_net_devices": "name the transfer network devices, comma separated",
    "transfer_devices": 'write a JSON array of device names, e.g. ["mlx5_0"]',
    "gpu_tls": "use cuda, cuda_copy or rocm",
    "kv_buffer_device": "use cuda (KV sent from GPU memory) or cpu (staged in host memory; a "
                        "CPU engine needs it)",
    "model_config_sha256": "give the 64-hex sha256 of the model's config.json",
    "gpu_memory_utilization": "use a number greater than 0 and at most 1",
    "ip": "give one of the fabric interface's own addresses, e.g. 10.0.0.5",
    "url": "write http://HOST:PORT with an explicit port and no path",
    "attestation_url": "write http://HOST:PORT/v1/attestation with an explicit port",
    "ssh_key": "give the absolute path of an existing private key file on this workstation",
    "grafana_bind_address": "give the IP address Grafana binds, e.g. 127.0.0.1 (0.0.0.0 for "
                            "every interface)",
    "prometheus_listen_address": "write HOST:PORT as Prometheus' --web.listen-address takes "
                                 "it, e.g. 127.0.0.1:9090 or :9090",
    "shared_gpu_allowance": "write true or false",
    "kv_canary_interval_s": f"give the seconds in which the router's KV canary probes each "
                            f"producer -> consumer pair once, a number from {CANARY_MIN_S:g} "
                            f"to {CANARY_MAX_S:g} (default {KV_CANARY_INTERVAL_S:g})",
    "workload_prompt_tokens": "give the typical prompt length in tokens, a whole number from 1 "
                              "to 10000000 (default 1024)",
    "workload_handoffs_per_s": "give the mean KV handoffs per second, a number above 0 "
                               "(default 1)",
    "workload_burst": "give the peak rate over the mean rate, a number of at least 1 "
                      "(default 1: no burst)",
    "workload_transfer_budget_ms": "give the milliseconds one handoff's KV transfer may take, "
                                   "a number above 0 (default 1000)",
    "workload_headroom": "give the margin on the required bandwidth, a number of at least 1, "
                         "e.g. 1.25 (the default)",
    "model_repo_id": refs.REPO_ID_FIX,
    "model_revision": refs.REVISION_FIX,
}


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("must be text")
    return value


def _no_shell(value: str) -> str:
    bad = sorted({c for c in value if c in SHELL_META})
    if bad:
        shown = " ".join(repr(c) for c in bad)
        raise ValueError(f"contains shell characters {shown}")
    return value


def _pattern(regex: re.Pattern[str], what: str) -> AfterValidator:
    def check(value: str) -> str:
        if not regex.fullmatch(value):
            raise ValueError(f"is not {what}")
        return value

    return AfterValidator(check)


def _abs_path(value: str) -> str:
    _no_shell(value)
    path = PurePosixPath(value)
    if not path.is_absolute():
        raise ValueError("is not an absolute path")
    if ".." in path.parts:
        raise ValueError("contains '..'")
    return str(path)


def _whole(value: Any) -> int:
    text = _text(value).strip()
    if not re.fullmatch(r"[0-9]+", text):
        raise ValueError("is not a whole number")
    if len(text.lstrip("0")) > MAX_DIGITS:
        raise ValueError(f"has more than {MAX_DIGITS} digits")
    return int(text)


def _port_range(value: Any) -> tuple[int, int]:
    match = re.fullmatch(r"([0-9]{1,5})-([0-9]{1,5})", _text(value))
    if not match:
        raise ValueError("is not LOW-HIGH")
    low, high = int(match[1]), int(match[2])
    if not 1 <= low <= high <= 65535:
        raise ValueError("is not an ascending range inside 1-65535")
    return (low, high)


def _gpu_ids(value: Any) -> tuple[str, ...]:
    items = [item.strip() for item in _text(value).split(",")]
    if not items or any(not item for item in items):
        raise ValueError("has an empty entry")
    for item in items:
        if not (re.fullmatch(r"[0-9]{1,3}", item) or GPU_UUID_RE.fullmatch(item)):
            raise ValueError(f"entry {item[:40]!r} is neither an index nor a GPU UUID")
    if len({canonical_spelling(item) for item in items}) != len(items):  # 0 and 00 alike
        raise ValueError("names a GPU twice")
    return tuple(items)


def _block_size(value: int) -> int:
    if value < 1 or value > 1024 or value & (value - 1):
        raise ValueError("is not a power of two from 1 to 1024")
    return value


def _finite(value: Any) -> float:
    """A finite float; NaN would pass every range check below, so it is refused first."""
    text = _text(value).strip()
    if text.lower().lstrip("+-") in {"nan", "inf", "infinity"}:
        raise ValueError("is not a finite number")
    if not DECIMAL_RE.fullmatch(text):
        raise ValueError("is not a number")
    number = float(text)
    if not math.isfinite(number):
        raise ValueError("is not a finite number")
    return number


def _fraction(value: Any) -> float:
    number = _finite(value)
    if not 0 < number <= 1:
        raise ValueError("is not in (0, 1]")
    return number


def _positive_seconds(value: Any) -> float:
    number = _finite(value)
    if number <= 0:
        raise ValueError("is not a number of seconds above 0")
    return number


def _canary_interval(value: Any) -> float:
    number = _finite(value)
    if not CANARY_MIN_S <= number <= CANARY_MAX_S:
        raise ValueError(f"is not a number of seconds from {CANARY_MIN_S:g} to {CANARY_MAX_S:g}")
    return number


def _above_zero(value: Any) -> float:
    number = _finite(value)
    if number <= 0:
        raise ValueError("is not a number above 0")
    return number


def _at_least_one(value: Any) -> float:
    number = _finite(value)
    if number < 1:
        raise ValueError("is not a number of at least 1")
    return number


def _ip(value: Any) -> str:
    try:
        return hostnames.ip_address(_text(value))
    except ValueError as exc:
        raise ValueError(f"is not an IP address: it {exc}") from None


def _listen(value: Any) -> str:
    return hostnames.listen_address(_text(value))


def _boolean(value: Any) -> bool:
    """Exactly `true` or `false`: `yes`, `1` and `on` read differently in every other tool."""
    text = _text(value)
    if text not in {"true", "false"}:
        raise ValueError("is not true or false")
    return text == "true"


Port = Annotated[int, BeforeValidator(_whole), Field(ge=1, le=65535)]
PositiveInt = Annotated[int, BeforeValidator(_whole), Field(ge=1)]
SafeText = Annotated[str, AfterValidator(_no_shell)]
AbsPath = Annotated[str, AfterValidator(_abs_path)]
ImageRef = Annotated[str, _pattern(IMAGE_RE, "an image ID or digest reference")]
Revision = Annotated[str, _pattern(REVISION_RE, "a full 40- or 64-hex commit id")]
Interface = Annotated[str, _pattern(IFACE_RE, "an interface name")]
ModelName = Annotated[str, _pattern(MODEL_NAME_RE, "a model name")]
DeploymentName = Annotated[str, _pattern(DEPLOYMENT_RE, "a lower-case name of letters, digits, -")]
Sha256Hex = Annotated[str, _pattern(SHA256_RE, "64 lower-case hex digits")]
PortRange = Annotated[tuple[int, int], BeforeValidator(_port_range)]
GpuIds = Annotated[tuple[str, ...], BeforeValidator(_gpu_ids)]
EngineArgs = Annotated[tuple[str, ...], BeforeValidator(jsonfields.engine_args)]
EngineEnv = Annotated[dict[str, str], BeforeValidator(jsonfields.engine_env)]
DeviceList = Annotated[tuple[str, ...], BeforeValidator(jsonfields.device_list)]
BlockSize = Annotated[int, BeforeValidator(_whole), AfterValidator(_block_size)]
Fraction = Annotated[float, BeforeValidator(_fraction)]
Seconds = Annotated[float, BeforeValidator(_positive_seconds)]
CanaryInterval = Annotated[float, BeforeValidator(_canary_interval)]
AboveZero = Annotated[float, BeforeValidator(_above_zero)]
AtLeastOne = Annotated[float, BeforeValidator(_at_least_one)]
PromptTokens = Annotated[int, BeforeValidator(_whole), Field(ge=1, le=10_000_000)]
BurstHandoffs = Annotated[int, BeforeValidator(_whole), Field(ge=1, le=100_000)]
IpText = Annotated[str, BeforeValidator(_ip)]
ListenAddress = Annotated[str, BeforeValidator(_listen)]
Boolean = Annotated[bool, BeforeValidator(_boolean)]
HfRepoId = Annotated[str, BeforeValidator(refs.hf_repo_id)]
GitRevision = Annotated[str, BeforeValidator(refs.git_revision)]
HubEndpoint = Annotated[str, BeforeValidator(lambda v: urls.check_hub_endpoint(str(v)))]
