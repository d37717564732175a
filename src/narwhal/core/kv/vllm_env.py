"""A launch environment, read as vLLM reads it: the variables that shape the KV cache.

vLLM takes part of its cache from the environment, not argv: the KV layout
(VLLM_KV_CACHE_LAYOUT) and the Mamba conv state orientation (VLLM_SSM_CONV_STATE_LAYOUT,
which NIXL requires to be DS). A prediction from argv alone describes an engine that was never
started, so every prediction of a launch (Gate C, narwhal-check, the engine emulator) reads its
environment here. Which variables count and which values they take is a version fact
(versions.py); this module only applies that table. Variables outside it are other programs'
and are passed over; a value vLLM would refuse, or an effect core/kv does not model, is
refused naming the variable, never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from narwhal.core.errors import ContractError, InputError, Problem
from narwhal.core.kv.versions import LaunchEnvVar, facts_for


def _refusal(where: str, name: str, text: str, var: LaunchEnvVar, release: str) -> Problem:
    """The problem of one value, with the values that would be read instead."""
    allowed = ", ".join(var.values)
    if var.field is not None:
        return Problem(f"{where}: {name}", f"{text!r} is not a value vLLM {release} accepts "
                       f"({var.effect})", f"set {name} to one of {allowed}, or unset it")
    keep = f" or set it to {allowed}" if allowed else ""
    return Problem(f"{where}: {name}", f"{name}={text!r} {var.effect}, which Narwhal does not "
                   "model: no prediction would match the engine", f"unset {name}{keep}")


def read_environment(environment: Mapping[str, str], *, vllm_version: str,
                     where: str = "environment") -> tuple[dict[str, Any], list[Problem]]:
    """The LaunchPlan fields the environment sets, and a problem for each variable that
    cannot be read (all of them, so one run names every one)."""
    try:
        facts = facts_for(vllm_version)
    except ContractError:
        return {}, []  # LaunchPlan refuses the version itself, naming it
    fields: dict[str, Any] = {}
    problems: list[Problem] = []
    for name in sorted(environment.keys() & facts.launch_env.keys()):
        var, text = facts.launch_env[name], environment[name]
        if text == "":
            continue  # set but empty: vLLM's default, as when it is unset
        if text not in var.values:
            problems.append(_refusal(where, name, text, var, facts.release))
        elif var.field is not None and var.values[text] is not None:
            fields[var.field] = var.values[text]
    return fields, problems


def plan_fields_from_environment(environment: Mapping[str, str], *, vllm_version: str,
                                 where: str = "environment") -> dict[str, Any]:
    """`read_environment`, with every problem raised together as one InputError."""
    fields, problems = read_environment(environment, vllm_version=vllm_version, where=where)
    if problems:
        raise InputError(where, problems)
    return fields
