"""The NIXL compatibility hash: vLLM's 12 factors and its own serialisation recipe.

vLLM hashes `json.dumps(factors, sort_keys=True)` with Python's default separators (", " and
": "), not Narwhal's canonical compact JSON, so this module deliberately does not use
`narwhal.core.documents.digest`: one byte of difference and the prediction never matches.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from narwhal.core.kv.plan import LaunchPlan
from narwhal.core.kv.versions import VllmFacts

FIX_BY_FACTOR = {
    "vllm_version": "run the same vLLM build on every engine (upgrade the fleet in lockstep)",
    "nixl_connector_version": "run the same vLLM release on every engine",
    "model": "pass the identical --model string on every engine (same repo id or same path)",
    "dtype": "pass the same --dtype on every engine",
    "num_kv_heads": "serve the same model config on every engine",
    "head_size": "serve the same model config on every engine",
    "num_hidden_layers": "serve the same model config on every engine",
    "attn_backend_name": "pin the same --attention-backend on every engine",
    "cache_dtype": "pass the same literal --kv-cache-dtype on every engine ('auto' != 'bfloat16')",
    "is_hma_enabled": "pass --disable-hybrid-kv-cache-manager on all engines or on none",
    "speculative_config": "use the same --speculative-config (or none) on every engine",
    "transfer_mode": "use the same connector (NixlConnector pull or NixlPushConnector) everywhere",
}


def speculative_factor(plan: LaunchPlan, facts: VllmFacts) -> dict[str, Any] | None:
    """The hashed speculative sub-object, or None when the method is not hashed."""
    spec = plan.speculative
    if spec is None or spec.method not in facts.hashed_speculative_methods:
        return None
    return {
        "method": spec.method,
        "model": spec.model,
        "revision": spec.revision,
        "code_revision": spec.code_revision,
        "parallel_drafting": spec.parallel_drafting,
        "kv_cache_dtype": spec.kv_cache_dtype or plan.kv_cache_dtype,
        "auxiliary_layer_ids": spec.auxiliary_layer_ids,
    }


def hash_factors(
    plan: LaunchPlan, facts: VllmFacts, *, dtype: str, num_kv_heads: int, head_size: int,
    num_hidden_layers: int, backend_name: str, hma: bool,
) -> dict[str, Any]:
    """The exact factor dict a worker builds in register_kv_caches."""
    factors: dict[str, Any] = {
        "vllm_version": plan.vllm_version,
        "nixl_connector_version": facts.nixl_connector_version,
        "model": plan.model,
        "dtype": f"torch.{dtype}",
        "num_kv_heads": num_kv_heads,
        "head_size": head_size,
        "num_hidden_layers": num_hidden_layers,
        "attn_backend_name": backend_name,
        "cache_dtype": plan.kv_cache_dtype,
        "is_hma_enabled": hma,
        "speculative_config": speculative_factor(plan, facts),
        "transfer_mode": plan.transfer_mode,
    }
    assert tuple(factors) == facts.hash_factor_keys  # the adapter owns the key set
    return factors


def vllm_hash(factors: dict[str, Any]) -> str:
    """sha256 hex of sorted-key JSON with Python's default separators, as vLLM computes it."""
    return hashlib.sha256(json.dumps(factors, sort_keys=True).encode("utf-8")).hexdigest()


def differing_factors(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Factor names whose values differ, in the adapter's key order."""
    return [k for k in a if a.get(k) != b.get(k)] + [k for k in b if k not in a]
