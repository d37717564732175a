"""Each failure reads as vLLM's line for the same cause, and the right ones drop a handshake."""

from __future__ import annotations

import pytest

from narwhal.core.kv.capture.sidechannel import parse_reply
from narwhal.core.kv.versions import V0_29_0
from narwhal.lab.engine.nixl import failures
from narwhal.lab.engine.nixl.handshake import (
    HandshakeError,
    RemoteEngine,
    runtime_problems,
    target_ranks,
)
from narwhal.lab.engine.nixl.wire import AgentBlob, agent_metadata, clock_frame, payload_frame
from tests.unit.engine_nixl.helpers import tiny

A, B = "a" * 64, "b" * 64


def test_hash_mismatch_is_vllms_text_naming_both_hashes_and_the_escape_hatch() -> None:
    line = failures.hash_mismatch(A, B)
    assert line.startswith(f"RuntimeError: NIXL compatibility hash mismatch. Local: {A}, "
                           f"Remote: {B}. Prefill and decode instances have incompatible")
    assert line.endswith("""--kv-transfer-config '{"kv_connector_extra_config": """
                         """{"enforce_handshake_compat": false}}'""")


@pytest.mark.parametrize(("kind", "text", "drop"), [
    ("disconnect", "NIXL_ERR_REMOTE_DISCONNECT", True),
    ("notify", "NIXL_ERR_REMOTE_DISCONNECT", True),
    ("stale", "restarted", True),
    ("expired", "lease expired", False),
    ("unknown", "does not know the request", False),
    ("blocks", "refused the read (blocks)", False),
])
def test_each_read_failure_maps_to_its_line(kind: str, text: str, drop: bool) -> None:
    line, dropped = failures.for_transfer(kind, "engine-p", "req-9")
    assert text in line and dropped is drop


def test_a_lease_failure_names_the_request() -> None:
    assert "req-9" in failures.for_transfer("expired", "engine-p", "req-9")[0]


@pytest.mark.parametrize(("local", "remote", "pp", "want"), [
    (1, 1, 1, [(0, 0)]),
    (2, 1, 1, [(0, 0)]),  # D wider: both local ranks read remote rank 0
    (1, 2, 1, [(0, 0), (0, 1)]),  # P wider: the one local rank reads both
    (4, 2, 1, [(0, 0), (0, 1)]),
    (2, 2, 2, [(0, 0), (0, 1), (1, 0), (1, 1)]),
])
def test_handshake_targets_follow_transfer_topology(local: int, remote: int, pp: int,
                                                    want: list[tuple[int, int]]) -> None:
    assert target_ranks(local, remote, pp) == want


def test_tp_sizes_that_do_not_divide_are_refused_before_contacting_anyone() -> None:
    with pytest.raises(HandshakeError, match="Local tensor parallel size 3 is not divisible"):
        target_ranks(3, 2, 1)


def remote_of(**plan: object) -> RemoteEngine:
    g = tiny(**plan)
    blob = AgentBlob("a", "127.0.0.1", 1, "n")
    replies = {(0, tp): parse_reply([payload_frame(g.compatibility_hash, agent_metadata(
        g, V0_29_0, "engine-p", 0, tp, blob.encode())), clock_frame()], V0_29_0)
        for tp in range(g.tp)}
    return RemoteEngine("engine-p", g.tp, g.pp, blob, replies)


def test_equal_plans_pass_the_runtime_checks() -> None:
    assert runtime_problems(tiny(), remote_of()) == []


def test_a_consumer_block_smaller_than_the_producers_fails_with_vllms_words() -> None:
    problems = runtime_problems(tiny(block_size=16), remote_of(block_size=32))
    assert any("Local block size 16 is not divisible by remote block size 32" in p
               for p in problems)


def test_heterogeneous_tp_passes_when_the_blocks_nest() -> None:
    assert runtime_problems(tiny(tensor_parallel_size=2, block_size=16),
                            remote_of(block_size=16)) == []
