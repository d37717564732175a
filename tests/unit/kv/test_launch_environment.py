"""Gate C's prediction of a launch record reads its environment as vLLM does: a hybrid fleet
set up as vLLM documents it (VLLM_SSM_CONV_STATE_LAYOUT=DS, which NIXL requires) passes, and a
variable that shapes the cache is either predicted or refused by name, never ignored."""

from __future__ import annotations

import json
from typing import Any

import pytest

from narwhal.core.cache_layout import CacheLayout, parse_cache_layout
from narwhal.core.errors import InputError
from narwhal.core.kv.capture.contract import pair_problems, predicted
from narwhal.core.kv.geometry import plan_geometry
from narwhal.core.kv.pair import check_pair
from narwhal.core.kv.plan import LaunchPlan
from narwhal.core.kv.versions import KNOWN_RELEASES
from narwhal.core.kv.vllm_args import launch_plan_from_args
from narwhal.core.launch_record import LaunchRecord
from tests.unit.kv.helpers import config

HYBRID = "qwen3-next-80b"  # Qwen3-Next: GDN layers with full attention every fourth
MODEL_DIR = "/models/qwen3-next"
DS = {"VLLM_SSM_CONV_STATE_LAYOUT": "DS"}
METADATA = {"num_regions": 1, "block_lens": [1], "block_strides": [1], "block_size": 16,
            "kv_cache_layout": "LBHNC", "ssm_sizes": [], "attn_backend_name": "x",
            "physical_blocks_per_logical_kv_block": 1, "num_blocks": None, "dcp_size": 1,
            "pcp_size": 1}


def _record(engine: str, environment: dict[str, str],
            vllm_args: tuple[str, ...] = ()) -> LaunchRecord:
    """A launch record as Gate A writes one: the side-channel variables plus the operator's
    NARWHAL_ENGINE_ENV values."""
    return LaunchRecord.model_validate_json(json.dumps({
        "schema": "narwhal.launch-record", "schema_version": 1, "engine": engine,
        "host": "node-1", "runtime": "docker", "image": {"ref": "x", "id": "sha256:" + "a" * 64},
        "accelerator": "nvidia", "devices": [{"index": 0, "uuid": "GPU-1", "pci_bus_id": "0:1"}],
        "tensor_parallel_size": 1, "model_dir": MODEL_DIR, "model_tree_sha256": "b" * 64,
        "served_model_name": "m", "run_dir": "/srv", "fabric_interface": "fab0",
        "fabric_address": "10.0.0.1",
        "ports": {"engine": 8000, "attest": 8100, "nixl_side_channel": 5600,
                  "ucx_tcp": [30000, 30100]},
        "kv_transfer_config": {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
        "environment": {"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.1",
                        "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600", **environment},
        "vllm_args": ["--served-model-name", "m", "--port", "8000", *vllm_args]}))


def _capture(checkpoint: dict[str, Any], version: str = "0.29.0") -> CacheLayout:
    """What predicted() reads of a capture: the reported version and the served config."""
    return parse_cache_layout({
        "schema": "narwhal.cache-layout", "schema_version": 2, "engine": "e",
        "launch_record_sha256": "f" * 64,
        "started": {"runtime": "docker", "id": "c" * 64, "created": "2026-12-01T00:00:00Z"},
        "healthy_after_s": 0.5, "version": version, "models": ["m"],
        "process_start_time_seconds": 1764547200.25, "cache_config_info": [],
        "startup": {"kv_cache_layout": "LBHNC", "attention_backends": [],
                    "available_kv_gib": None, "kv_cache_tokens": None, "max_model_len": None,
                    "max_concurrency": None, "device": None, "compatibility_hash_passed": None},
        "ranks": [{"pp_rank": 0, "tp_rank": 0, "compatibility_hash": "h", "engine_id": "x",
                   "metadata": METADATA}],
        "completion": {"prompt": "p", "text": "t", "usage": None},
        "checkpoint_config": checkpoint}, "capture")


@pytest.mark.parametrize("version", KNOWN_RELEASES)
def test_a_hybrid_fleet_with_ds_in_its_launch_environment_predicts_ds_and_pairs(
        version: str) -> None:
    """The documented hybrid setup passes the contract gate's pair rules."""
    capture = _capture(config(HYBRID), version)
    p = predicted("p", _record("p", DS), capture)
    d = predicted("d", _record("d", DS), capture)
    assert p.has_mamba and p.plan.ssm_conv_state_layout == d.plan.ssm_conv_state_layout == "DS"
    assert pair_problems(check_pair(p, d)) == pair_problems(check_pair(d, p)) == []


def test_a_hybrid_engine_without_it_fails_its_pairs_naming_the_variable() -> None:
    """Left unset, vLLM's SD default is predicted and the finding says what to set, where."""
    capture = _capture(config(HYBRID))
    p = predicted("p", _record("p", {}), capture)
    d = predicted("d", _record("d", DS), capture)
    assert p.plan.ssm_conv_state_layout == "SD"
    [finding] = check_pair(p, d).findings
    assert finding.factor == "VLLM_SSM_CONV_STATE_LAYOUT"
    assert finding.fix == "set VLLM_SSM_CONV_STATE_LAYOUT=DS on p"
    assert "VLLM_SSM_CONV_STATE_LAYOUT" in pair_problems(check_pair(d, p))[0].field


@pytest.mark.parametrize(("name", "value", "allowed"), [
    ("VLLM_SSM_CONV_STATE_LAYOUT", "XY", "SD, DS"),
    ("VLLM_SSM_CONV_STATE_LAYOUT", "ds", "SD, DS"),  # vLLM's choices are case-sensitive
    ("VLLM_KV_CACHE_LAYOUT", "HDN", "LBNHC, LBHNC, LHBNC, NHD, HND, BLHNC, BLNHC, BHLNC"),
    ("VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE", "yes", "0, 1"),
])
def test_a_value_vllm_refuses_is_refused_naming_the_variable_and_its_values(
        name: str, value: str, allowed: str) -> None:
    """A guess would predict an engine vLLM never starts; the fix lists what it accepts."""
    with pytest.raises(InputError) as info:
        predicted("p", _record("p", {name: value}), _capture(config(HYBRID)))
    [problem] = info.value.problems
    assert problem.field == f"p: environment: {name}"
    assert repr(value) in problem.problem
    assert problem.fix == f"set {name} to one of {allowed}, or unset it"


def test_every_unreadable_variable_and_flag_is_named_in_one_error() -> None:
    """One run names every problem of the record, environment and arguments together."""
    env = {"VLLM_SSM_CONV_STATE_LAYOUT": "XY", "VLLM_KV_CACHE_LAYOUT": "HDN"}
    with pytest.raises(InputError) as info:
        predicted("p", _record("p", env, ("--block-size", "x")), _capture(config(HYBRID)))
    fields = [p.field for p in info.value.problems]
    assert fields == ["p: vllm_args: --block-size", "p: environment: VLLM_KV_CACHE_LAYOUT",
                      "p: environment: VLLM_SSM_CONV_STATE_LAYOUT"]


@pytest.mark.parametrize(("fixture", "model", "layout"), [
    ("llama-3.1-8b", "llama", "NHD"), ("llama-3.1-8b", "llama", "HND"),
    (HYBRID, "hybrid", "NHD"), ("llama-3.1-8b", "llama", "LBNHC"),
])
def test_vllm_kv_cache_layout_in_the_environment_predicts_what_the_override_does(
        fixture: str, model: str, layout: str) -> None:
    """The environment and `narwhal kv plan --kv-cache-layout` are one setting, one geometry."""
    capture = _capture(config(fixture))
    from_env = predicted("p", _record("p", {"VLLM_KV_CACHE_LAYOUT": layout}), capture)
    override = plan_geometry(config(fixture), LaunchPlan(
        name="p", model=MODEL_DIR, vllm_version="0.29.0", kv_cache_layout=layout))
    assert from_env == override
    assert from_env.layout_reason == "VLLM_KV_CACHE_LAYOUT override"
    if layout != "HND":  # HND is LBHNC, NIXL's own choice; the others change the layout
        assert from_env.kv_cache_layout != predicted("p", _record("p", {}), capture).kv_cache_layout


def test_other_programs_variables_are_passed_over() -> None:
    """UCX, CUDA, HF and unknown VLLM_ variables do not shape the cache; nothing changes."""
    capture = _capture(config(HYBRID))
    others = {"UCX_TLS": "tcp", "CUDA_VISIBLE_DEVICES": "0", "HF_HOME": "/hf",
              "VLLM_LOGGING_LEVEL": "DEBUG", "VLLM_CPU_KVCACHE_SPACE": "4"}
    assert predicted("p", _record("p", others), capture) == \
        predicted("p", _record("p", {}), capture)


@pytest.mark.parametrize(("name", "value"), [
    ("VLLM_MLA_DISABLE", "1"), ("VLLM_PP_LAYER_PARTITION", "30,31"),
    ("VLLM_MODEL_REDIRECT_PATH", "/etc/redirects.json"),
])
def test_a_variable_that_shapes_the_cache_in_a_way_not_modelled_is_refused(
        name: str, value: str) -> None:
    """Ignoring it would compare the engine with a plan it does not run."""
    with pytest.raises(InputError) as info:
        predicted("p", _record("p", {name: value}), _capture(config(HYBRID)))
    [problem] = info.value.problems
    assert problem.field == f"p: environment: {name}"
    assert "does not model" in problem.problem and problem.fix.startswith(f"unset {name}")


def test_their_no_op_values_and_empty_values_are_read_as_unset() -> None:
    capture = _capture(config(HYBRID))
    quiet = {"VLLM_MLA_DISABLE": "0", "VLLM_PP_LAYER_PARTITION": "",
             "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE": "0",
             "VLLM_KV_CACHE_LAYOUT": ""}
    assert predicted("p", _record("p", quiet), capture) == \
        predicted("p", _record("p", {}), capture)


def test_a_chunked_local_model_keeps_hma_when_the_environment_allows_it() -> None:
    """vLLM turns HMA (a hash factor) off for chunked-local attention unless the variable is 1;
    an explicit --disable-hybrid-kv-cache-manager still wins, as in vLLM."""
    chunked = {**config("llama-3.1-8b"), "attention_chunk_size": 8192}
    capture = _capture(chunked)
    allow = {"VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE": "1"}
    assert predicted("p", _record("p", {}), capture).hash_factors["is_hma_enabled"] is False
    assert predicted("p", _record("p", allow), capture).hash_factors["is_hma_enabled"] is True
    flagged = _record("p", allow, ("--disable-hybrid-kv-cache-manager",))
    assert predicted("p", flagged, capture).hash_factors["is_hma_enabled"] is False


def test_argv_alone_still_reads_the_parallel_sizes() -> None:
    """The node's capture reads only TP/PP from argv; no environment is needed there."""
    plan = launch_plan_from_args(["/m", "-tp", "2"], name="e", vllm_version="0.32.0")
    assert plan.tensor_parallel_size == 2 and plan.ssm_conv_state_layout == "SD"
