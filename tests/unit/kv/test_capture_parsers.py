"""Live-capture parsers read real vLLM output and refuse what they cannot prove."""

from __future__ import annotations

import struct

import msgpack
import pytest

from narwhal.core.errors import ContractError
from narwhal.core.kv.capture.endpoints import (
    parse_cache_config_info,
    parse_process_start_time,
    parse_version_reply,
)
from narwhal.core.kv.capture.logs import parse_capacity, parse_layout, parse_startup_log
from narwhal.core.kv.capture.sidechannel import metadata_mismatches, parse_reply, request_frame
from narwhal.core.kv.geometry import plan_geometry
from narwhal.core.kv.plan import LaunchPlan
from narwhal.core.kv.versions import V0_29_0, V0_33_0
from tests.unit.kv.helpers import FIXTURES, config


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


def reply_frames() -> list[bytes]:
    raw = (FIXTURES / "tiny-llama-rank0.reply.bin").read_bytes()
    frames, pos = [], 0
    while pos < len(raw):
        (size,) = struct.unpack(">I", raw[pos:pos + 4])
        frames.append(raw[pos + 4:pos + 4 + size])
        pos += 4 + size
    return frames


def test_gpu_startup_log_yields_layout_backend_memory_and_capacity() -> None:
    facts = parse_startup_log(text("v0.29-gpu-startup.log"))
    assert facts.kv_cache_layout == "LBHNC"
    assert facts.attention_backends == ("FLASH_ATTN",)
    assert facts.available_kv_gib == 60.0
    assert (facts.device, facts.kv_cache_tokens, facts.max_model_len, facts.max_concurrency) == (
        "GPU", 491520, 131072, 3.75)


def test_cpu_capacity_line_is_read_like_the_gpu_one() -> None:
    assert parse_capacity(text("v0.32-cpu-startup.log")) == ("CPU", 1048576, 512, 2048.0)


def test_connector_intent_alone_is_not_proof_of_the_resolved_layout() -> None:
    with pytest.raises(ContractError, match=r"no 'Using <LAYOUT> KV cache layout\.' line"):
        parse_layout(text("v0.32-cpu-startup.log"))


def test_log_without_any_layout_line_is_refused() -> None:
    log = "\n".join(line for line in text("v0.29-gpu-startup.log").splitlines()
                    if "layout" not in line)
    with pytest.raises(ContractError, match="no 'Using"):
        parse_startup_log(log)


def test_log_with_two_different_layouts_is_refused_naming_both() -> None:
    extra = "INFO [kv_cache_layout.py:97] Using LBNHC KV cache layout.\n"
    log = text("v0.29-gpu-startup.log") + extra
    with pytest.raises(ContractError, match="2 different KV layouts") as err:
        parse_layout(log)
    assert "LBHNC" in str(err.value) and "LBNHC" in str(err.value)


def test_repeated_identical_layout_lines_from_several_workers_agree() -> None:
    log = text("v0.29-gpu-startup.log") + "Detected kv cache layout LBHNC\n"
    assert parse_layout(log) == "LBHNC"


def test_cache_config_info_labels_from_a_real_cpu_engine() -> None:
    [info] = parse_cache_config_info(text("v0.32-cpu-metrics.txt"))
    assert info.int_label("block_size") == 128
    assert info.int_label("num_gpu_blocks") == 8192
    assert info.int_label("num_cpu_blocks") is None
    assert info.labels["kv_cache_max_concurrency"] == "2048.0"
    assert info.labels["kv_cache_layout"] == "None"
    assert len(info.labels) == 36


def test_process_start_time_binds_the_capture_to_one_engine_generation() -> None:
    assert parse_process_start_time(text("v0.32-cpu-metrics.txt")) == 1764496711.52


def test_metrics_without_process_start_time_are_refused() -> None:
    with pytest.raises(ContractError, match="0 process_start_time_seconds"):
        parse_process_start_time(text("v0.32-cpu-metrics-no-start-time.txt"))


def test_metrics_without_cache_config_info_are_refused() -> None:
    with pytest.raises(ContractError, match="no vllm:cache_config_info"):
        parse_cache_config_info("process_start_time_seconds 1.0\n")


def test_version_reply_is_the_hash_factor_verbatim() -> None:
    assert parse_version_reply(text("v0.32-version.json")) == "0.32.0"


@pytest.mark.parametrize("body", ["not json", "{}", '{"version": ""}', "[]"])
def test_malformed_version_reply_is_refused(body: str) -> None:
    with pytest.raises(ContractError):
        parse_version_reply(body)


def test_side_channel_reply_matches_the_prediction_for_the_tiny_model() -> None:
    reply = parse_reply(reply_frames(), V0_29_0)
    plan = LaunchPlan(model="/tmp/vllm-cpu/tiny-llama", dtype="float32",
                      attention_backend="CPU_ATTN")
    predicted = plan_geometry(config("tiny-llama"), plan)
    assert reply.compatibility_hash == predicted.compatibility_hash
    assert metadata_mismatches(predicted.stages[0].metadata, reply.as_agent_metadata()) == []
    assert reply.metadata["block_lens"] == [65536, 65536]


def test_side_channel_reply_with_an_unknown_field_names_the_release() -> None:
    frames = reply_frames()
    payload = msgpack.unpackb(frames[0])
    meta = msgpack.unpackb(payload["agent_metadata_bytes"])
    meta["region_names"] = ["layer.0", "layer.1"]
    payload["agent_metadata_bytes"] = msgpack.packb(meta)
    broken = [msgpack.packb(payload), frames[1]]
    with pytest.raises(ContractError, match=r"vLLM 0\.29\.0.*region_names"):
        parse_reply(broken, V0_29_0)
    assert parse_reply(broken, V0_33_0).metadata["region_names"] == ["layer.0", "layer.1"]


@pytest.mark.parametrize("frames", [[b"\xc1"], [b"\xc1", b"\xcb"], [msgpack.packb({"x": 1}), b"1"]])
def test_undecodable_side_channel_replies_are_refused(frames: list[bytes]) -> None:
    with pytest.raises(ContractError):
        parse_reply(frames, V0_29_0)


def test_request_frame_is_the_documented_three_element_array() -> None:
    assert msgpack.unpackb(request_frame(0, 1, 1, 2)) == [b"get_meta_msg", 0, 1]


@pytest.mark.parametrize(("pp", "tp"), [(0, 2), (1, 0), (-1, 0), (0, -1)])
def test_request_frame_for_a_rank_that_does_not_exist_is_never_built(pp: int, tp: int) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        request_frame(pp, tp, 1, 2)


def test_prediction_reports_each_differing_metadata_field() -> None:
    reply = parse_reply(reply_frames(), V0_29_0).as_agent_metadata()
    plan = LaunchPlan(model="m", dtype="float32", attention_backend="CPU_ATTN", block_size=16)
    predicted = plan_geometry(config("tiny-llama"), plan).stages[0].metadata
    found = metadata_mismatches(predicted, reply)
    assert any(m.startswith("block_lens") for m in found)
    assert any(m.startswith("block_size: predicted 16") for m in found)
