"""A launch record's `vllm serve` arguments, read as core/kv's LaunchPlan.

Gate C predicts each engine's cache from the arguments it is started with, so this reader
is the one place that knows which `vllm serve` flags shape KV geometry and the compatibility
hash, in both spellings vLLM accepts (`--block-size 16`, `--block-size=16`, underscores for
dashes, `-tp`). Flags that do not shape the cache (ports, served names, memory utilisation)
are passed over; a shaping flag whose value cannot be read is refused naming it, never
guessed. What vLLM reads from the launch environment instead is vllm_env.py's; the plan of a
launch is both.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from narwhal.core.document_io import problems_from
from narwhal.core.errors import InputError, Problem
from narwhal.core.kv.plan import LaunchPlan, SpeculativePlan
from narwhal.core.kv.vllm_env import read_environment

# flag -> (LaunchPlan field, kind)
VALUE_FLAGS: dict[str, tuple[str, str]] = {
    "--model": ("model", "str"),
    "--dtype": ("dtype", "str"),
    "--tensor-parallel-size": ("tensor_parallel_size", "int"),
    "-tp": ("tensor_parallel_size", "int"),
    "--pipeline-parallel-size": ("pipeline_parallel_size", "int"),
    "-pp": ("pipeline_parallel_size", "int"),
    "--data-parallel-size": ("data_parallel_size", "int"),
    "-dp": ("data_parallel_size", "int"),
    "--block-size": ("block_size", "int"),
    "--kv-cache-dtype": ("kv_cache_dtype", "str"),
    "--attention-backend": ("attention_backend", "str"),
    "--max-model-len": ("max_model_len", "size"),
    "--kv-cache-memory-bytes": ("available_kv_bytes", "size"),
    "--mamba-cache-dtype": ("mamba_cache_dtype", "str"),
    "--mamba-ssm-cache-dtype": ("mamba_ssm_cache_dtype", "str"),
    "--mamba-cache-mode": ("mamba_cache_mode", "str"),
    "--speculative-config": ("speculative", "json"),
}
BOOL_FLAGS: dict[str, tuple[str, bool]] = {
    "--enable-prefix-caching": ("enable_prefix_caching", True),
    "--no-enable-prefix-caching": ("enable_prefix_caching", False),
    "--disable-hybrid-kv-cache-manager": ("disable_hybrid_kv_cache_manager", True),
}
# Flags of `vllm serve` that take a value but do not shape the cache: their value is skipped.
OTHER_VALUE_FLAGS = frozenset({
    "--served-model-name", "--port", "--host", "--gpu-memory-utilization",
    "--kv-transfer-config", "--kv-events-config", "--max-num-seqs", "--max-num-batched-tokens", "--seed",
    "--tokenizer", "--revision", "--api-key", "--uvicorn-log-level", "--swap-space",
    "--distributed-executor-backend", "--load-format", "--quantization", "--chat-template",
    "--generation-config", "--override-generation-config", "--limit-mm-per-prompt"})
SIZE_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _size(text: str) -> int:
    """`4096`, `64M`, `1G` (binary, as vLLM's human-readable sizes) or `1e9`."""
    low = text.strip().lower()
    if low and low[-1] in SIZE_UNITS:
        return int(float(low[:-1]) * SIZE_UNITS[low[-1]])
    return int(float(low)) if "e" in low or "." in low else int(low)


def _value(kind: str, text: str) -> Any:
    if kind == "int":
        return int(text)
    if kind == "size":
        return _size(text)
    if kind == "json":
        return SpeculativePlan.model_validate(json.loads(text)).model_dump()
    return text


def _read_args(args: Sequence[str], where: str) -> tuple[dict[str, Any], list[Problem]]:
    """The LaunchPlan fields argv sets, and a problem for every flag that cannot be read."""
    fields: dict[str, Any] = {}
    problems: list[Problem] = []
    items = list(args)
    i = 0
    while i < len(items):
        arg = items[i]
        if not arg.startswith("-"):
            if "model" in fields:
                problems.append(Problem(where, f"a second positional argument {arg!r}",
                                        "give the model once, first"))
            fields["model"] = arg
            i += 1
            continue
        flag, eq, inline = arg.partition("=")
        if flag.startswith("--"):
            flag = "--" + flag[2:].replace("_", "-")
        if flag in BOOL_FLAGS:
            key, value = BOOL_FLAGS[flag]
            fields[key] = value
            i += 1
            continue
        takes_value = flag in VALUE_FLAGS or flag in OTHER_VALUE_FLAGS
        if takes_value and not eq:
            if i + 1 >= len(items):
                problems.append(Problem(where, f"{flag} has no value", f"give {flag} a value"))
                break
            inline, i = items[i + 1], i + 1
        i += 1
        if flag in VALUE_FLAGS:
            key, kind = VALUE_FLAGS[flag]
            try:
                fields[key] = _value(kind, inline)
            except (ValueError, ValidationError) as exc:
                problems.append(Problem(f"{where}: {flag}", f"{inline!r} cannot be read "
                                        f"({str(exc).splitlines()[0]})", "fix the value"))
    if "model" not in fields and not problems:
        problems.append(Problem(where, "no model", "give the model path first"))
    return fields, problems


def launch_plan_from_args(args: Sequence[str], *, name: str, vllm_version: str,
                          where: str = "vllm_args",
                          environment: Mapping[str, str] | None = None,
                          environment_where: str = "environment") -> LaunchPlan:
    """The LaunchPlan of `vllm serve MODEL ARGS...` (args without `vllm serve`) started with
    `environment`, since vLLM takes the KV layout and the Mamba conv state orientation from
    there (vllm_env.py). A flag goes over the environment, as in vLLM. None reads argv alone:
    only for the parallel sizes, never for a prediction of a launch record."""
    env_fields, problems = read_environment(environment or {}, vllm_version=vllm_version,
                                            where=environment_where)
    arg_fields, arg_problems = _read_args(args, where)
    problems = [*arg_problems, *problems]
    if problems:
        raise InputError(where, problems)
    fields = {**env_fields, **arg_fields, "name": name, "vllm_version": vllm_version}
    try:
        return LaunchPlan.model_validate(fields)
    except ValidationError as exc:
        raise InputError(where, problems_from(exc, LaunchPlan,
                                              reference="docs/kv-contract.md")) from None
