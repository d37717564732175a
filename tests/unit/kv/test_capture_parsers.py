"""Live-capture parsers read real vLLM output and refuse what they cannot prove.

The vLLM 0.32.0 inputs are real captures of two CPU engines (tests/fixtures/vllm-0.32.0, taken
by `python -m tests.real.capture`); the negative cases are those same texts with one line
removed, duplicated or changed, so every refusal is tested on text vLLM really writes.
"""

from __future__ import annotations

import json

import msgpack
import pytest

from narwhal.core.cache_layout import CacheLayout
from narwhal.core.documents import canonical_json
from narwhal.core.errors import ContractError
from narwhal.core.kv.capture.endpoints import (
    parse_cache_config_info,
    parse_process_start_time,
    parse_version_reply,
)
from narwhal.core.kv.capture.logs import (
    StartupFacts,
    parse_capacity,
    parse_layout,
    parse_startup_log,
)
from narwhal.core.kv.capture.sidechannel import metadata_mismatches, parse_reply, request_frame
from narwhal.core.kv.geometry import plan_geometry
from narwhal.core.kv.plan import LaunchPlan
from narwhal.core.kv.versions import V0_29_0, V0_32_0
from tests.unit.kv.helpers import FIXTURES, real, real_frames, real_manifest, real_plan


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


def without(body: str, *needles: str) -> str:
    return "\n".join(line for line in body.splitlines()
                     if not any(n in line for n in needles)) + "\n"


def test_gpu_startup_log_yields_layout_backend_memory_and_capacity() -> None:
    facts = parse_startup_log(text("v0.29-gpu-startup.log"))
    assert facts.kv_cache_layout == "LBHNC"
    assert facts.attention_backends == ("FLASH_ATTN",)
    assert facts.available_kv_gib == 60.0
    assert (facts.device, facts.kv_cache_tokens, facts.max_model_len, facts.max_concurrency) == (
        "GPU", 491520, 131072, 3.75)


def test_real_cpu_startup_log_yields_layout_backend_and_capacity() -> None:
    facts = parse_startup_log(real("startup-prefill.log"))
    assert facts.kv_cache_layout == "LBHNC"
    assert facts.attention_backends == ("CPU_ATTN",)
    assert (facts.device, facts.kv_cache_tokens, facts.max_model_len, facts.max_concurrency) == (
        "CPU", 65536, 512, 128.0)
    # The CPU worker states its KV budget in its own words, not "Available KV cache memory".
    assert facts.available_kv_gib is None
    assert facts.compatibility_hash_passed is None  # P never initiates a handshake



def test_the_startup_facts_written_are_the_ones_cache_layout_reads_back() -> None:
    """One type: what the capture writes as `startup` is what every reader of the file gets."""
    assert CacheLayout.model_fields["startup"].annotation is StartupFacts
    facts = parse_startup_log(text("v0.29-gpu-startup.log"))
    written = canonical_json(facts.model_dump(mode="json"))
    assert written == (
        '{"attention_backends":["FLASH_ATTN"],"available_kv_gib":60.0,'
        '"compatibility_hash_passed":null,"device":"GPU","kv_cache_layout":"LBHNC",'
        '"kv_cache_tokens":491520,"max_concurrency":3.75,"max_model_len":131072}')
    assert StartupFacts.model_validate_json(json.dumps(json.loads(written))) == facts

def test_real_consumer_log_names_the_hash_it_accepted() -> None:
    [hash_line, *_] = [line for line in real("decode-handoff.log").splitlines()
                       if "compatibility check passed" in line]
    log = real("startup-prefill.log") + hash_line + "\n"
    reply = parse_reply(real_frames(), V0_32_0)
    assert parse_startup_log(log).compatibility_hash_passed == reply.compatibility_hash


def test_connector_intent_alone_is_not_proof_of_the_resolved_layout() -> None:
    log = without(real("startup-prefill.log"), "Using LBHNC KV cache layout.",
                  "Detected kv cache layout")
    assert "NixlConnector setting KV cache layout to LBHNC" in log
    with pytest.raises(ContractError, match=r"no 'Using <LAYOUT> KV cache layout\.' line"):
        parse_layout(log)


def test_real_log_without_any_layout_line_is_refused() -> None:
    log = without(real("startup-prefill.log"), "layout")
    with pytest.raises(ContractError, match="no 'Using"):
        parse_startup_log(log)


def test_real_log_with_two_different_layouts_is_refused_naming_both() -> None:
    body = real("startup-prefill.log")
    [line] = [x for x in body.splitlines() if "Using LBHNC KV cache layout." in x]
    log = body + line.replace("LBHNC", "LBNHC") + "\n"
    with pytest.raises(ContractError, match="2 different KV layouts") as err:
        parse_layout(log)
    assert "LBHNC" in str(err.value) and "LBNHC" in str(err.value)


def test_repeated_identical_layout_lines_from_several_workers_agree() -> None:
    body = real("startup-prefill.log")
    [line] = [x for x in body.splitlines() if "Detected kv cache layout LBHNC" in x]
    assert parse_layout(body + line + "\n") == "LBHNC"


def test_two_different_capacity_lines_are_refused() -> None:
    body = real("startup-prefill.log")
    [line] = [x for x in body.splitlines() if "CPU KV cache size" in x]
    log = body + line.replace("65,536", "131,072").replace("128.00x", "256.00x") + "\n"
    with pytest.raises(ContractError, match="2 different KV cache size lines"):
        parse_capacity(log)


def test_cache_config_info_labels_from_a_real_cpu_engine() -> None:
    [info] = parse_cache_config_info(real("metrics-idle.txt"))
    assert info.int_label("block_size") == 128
    assert info.int_label("num_gpu_blocks") == 512
    assert info.int_label("num_cpu_blocks") is None
    assert info.int_label("kv_cache_memory_bytes") == 64 * 1024 * 1024
    assert info.labels["kv_cache_max_concurrency"] == "128.0"
    assert info.labels["kv_cache_layout"] == "None"
    assert info.labels["mamba_ssm_cache_dtype"] == "float32"  # the CPU platform forces it
    assert len(info.labels) == 37


def test_real_cache_config_info_equals_the_prediction_for_the_captured_plan() -> None:
    [info] = parse_cache_config_info(real("metrics-idle.txt"))
    geometry = plan_geometry(real_manifest()["model_config"], real_plan())
    assert geometry.capacity is not None
    assert info.int_label("block_size") == geometry.block_size
    assert info.int_label("num_gpu_blocks") == geometry.capacity.num_blocks
    assert info.int_label("kv_cache_size_tokens") == geometry.capacity.kv_cache_size_tokens
    assert info.labels["kv_cache_max_concurrency"] == str(geometry.capacity.max_concurrency)


def test_non_integer_label_is_refused_naming_it() -> None:
    body = real("metrics-idle.txt").replace('num_gpu_blocks="512"', 'num_gpu_blocks="lots"')
    [info] = parse_cache_config_info(body)
    with pytest.raises(ContractError, match="num_gpu_blocks='lots'"):
        info.int_label("num_gpu_blocks")


def test_process_start_time_binds_the_capture_to_one_engine_generation() -> None:
    body = real("metrics-idle.txt")
    [line] = [x for x in body.splitlines() if x.startswith("process_start_time_seconds ")]
    assert "e+09" in line  # vLLM prints it in exponent form
    assert parse_process_start_time(body) == float(line.split()[1]) > 1.7e9


def test_real_metrics_without_process_start_time_are_refused() -> None:
    body = without(real("metrics-idle.txt"), "process_start_time_seconds")
    assert "vllm:cache_config_info" in body
    with pytest.raises(ContractError, match="0 process_start_time_seconds"):
        parse_process_start_time(body)


def test_real_metrics_with_two_start_times_are_refused() -> None:
    body = real("metrics-idle.txt")
    body += "process_start_time_seconds 1.8e+09\n"
    with pytest.raises(ContractError, match="2 process_start_time_seconds"):
        parse_process_start_time(body)


def test_metrics_without_cache_config_info_are_refused() -> None:
    body = without(real("metrics-idle.txt"), "vllm:cache_config_info")
    with pytest.raises(ContractError, match="no vllm:cache_config_info"):
        parse_cache_config_info(body)


def test_version_reply_is_the_hash_factor_verbatim() -> None:
    assert parse_version_reply(real("version.json")) == "0.32.0"


@pytest.mark.parametrize("body", ["not json", "{}", '{"version": ""}', "[]"])
def test_malformed_version_reply_is_refused(body: str) -> None:
    with pytest.raises(ContractError):
        parse_version_reply(body)


def test_real_side_channel_reply_matches_the_prediction_for_the_tiny_model() -> None:
    reply = parse_reply(real_frames(), V0_32_0)
    predicted = plan_geometry(real_manifest()["model_config"], real_plan())
    assert reply.compatibility_hash == predicted.compatibility_hash
    assert metadata_mismatches(predicted.stages[0].metadata, reply.as_agent_metadata()) == []
    assert reply.metadata["block_lens"] == [65536, 65536]
    assert reply.metadata["num_blocks"] == 512
    assert list(reply.metadata) == list(V0_32_0.metadata_fields)


def test_a_0_32_reply_read_as_0_29_names_the_release_and_the_new_fields() -> None:
    with pytest.raises(ContractError, match=r"vLLM 0\.29\.0.*region_names") as err:
        parse_reply(real_frames(), V0_29_0)
    assert "packed_member_layouts" in str(err.value)


def _edited(**changes: object) -> list[bytes]:
    frames = real_frames()
    payload = msgpack.unpackb(frames[0])
    meta = msgpack.unpackb(payload["agent_metadata_bytes"])
    for key, value in changes.items():
        if value is None:
            del meta[key]
        else:
            meta[key] = value
    payload["agent_metadata_bytes"] = msgpack.packb(meta)
    return [msgpack.packb(payload), frames[1]]


def test_real_reply_with_an_unknown_field_is_refused() -> None:
    with pytest.raises(ContractError, match=r"vLLM 0\.32\.0.*unexpected \['kv_lease'\]"):
        parse_reply(_edited(kv_lease=30), V0_32_0)


def test_real_reply_missing_a_field_is_refused() -> None:
    with pytest.raises(ContractError, match=r"missing \['block_strides'\]"):
        parse_reply(_edited(block_strides=None), V0_32_0)


@pytest.mark.parametrize("frames", [[b"\xc1"], [b"\xc1", b"\xcb"], [msgpack.packb({"x": 1}), b"1"]])
def test_undecodable_side_channel_replies_are_refused(frames: list[bytes]) -> None:
    with pytest.raises(ContractError):
        parse_reply(frames, V0_32_0)


def test_real_reply_with_a_third_frame_is_refused() -> None:
    with pytest.raises(ContractError, match="3 frames"):
        parse_reply([*real_frames(), b"\x00"], V0_32_0)


def test_request_frame_is_the_documented_three_element_array() -> None:
    assert msgpack.unpackb(request_frame(0, 1, 1, 2)) == [b"get_meta_msg", 0, 1]


@pytest.mark.parametrize(("pp", "tp"), [(0, 2), (1, 0), (-1, 0), (0, -1)])
def test_request_frame_for_a_rank_that_does_not_exist_is_never_built(pp: int, tp: int) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        request_frame(pp, tp, 1, 2)


def test_prediction_reports_each_differing_metadata_field() -> None:
    reply = parse_reply(real_frames(), V0_32_0).as_agent_metadata()
    plan = real_plan(block_size=64)
    predicted = plan_geometry(real_manifest()["model_config"], plan).stages[0].metadata
    found = metadata_mismatches(predicted, reply)
    assert any(m.startswith("block_lens") for m in found)
    assert any(m.startswith("block_size: predicted 64") for m in found)
    assert any(m.startswith("num_blocks: predicted 1024") for m in found)


def test_plan_for_the_wrong_model_string_predicts_another_hash() -> None:
    reply = parse_reply(real_frames(), V0_32_0)
    other = plan_geometry(real_manifest()["model_config"],
                          LaunchPlan.model_validate({**real_plan().model_dump(),
                                                     "model": "tiny-llama"}))
    assert other.compatibility_hash != reply.compatibility_hash
