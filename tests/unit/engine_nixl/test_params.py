"""kv_transfer_params: the producer writes vLLM 0.32's object; the consumer sorts what it gets
the way vLLM 0.32's scheduler does (pull, `Got invalid KVTransferParams`, or a dead engine)."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.lab.engine.nixl.api import KvConnector
from narwhal.lab.engine.nixl.connector import make_connector
from narwhal.lab.engine.nixl.params import parse_remote
from narwhal.lab.engine.nixl.settings import NixlConfig
from tests.unit.engine_nixl.helpers import Metrics, Switches, recorded_logger, tiny

# The real reply of vLLM 0.32.0 pull mode (real-vllm-cpu.md), key order included.
REAL_KEYS = ["do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id",
             "remote_request_id", "remote_host", "remote_port", "tp_size", "dcp_size", "pp_size",
             "remote_num_tokens", "remote_blocks_expiry_time", "transfer_mode",
             "remote_prefill_cached_tokens"]


def connector(**plan: Any) -> KvConnector:
    kv = {"kv_connector": "NixlConnector", "kv_role": "kv_producer",
          "engine_id": "engine-p"}
    log, _ = recorded_logger("params")
    return make_connector(NixlConfig(kv, side_channel_host="10.9.0.2"), tiny(**plan), Metrics(), Switches(),
                          log)


def test_hold_returns_the_real_pull_mode_params_with_their_types() -> None:
    params = connector().hold("cmpl-abc-0", list(range(306)))
    assert list(params) == REAL_KEYS
    assert params == {
        "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[1, 2, 3]],
        "remote_engine_id": "engine-p", "remote_request_id": "cmpl-abc-0",
        "remote_host": "10.9.0.2", "remote_port": 5600, "tp_size": 1, "dcp_size": 1,
        "pp_size": 1, "remote_num_tokens": 306, "remote_blocks_expiry_time": None,
        "transfer_mode": "pull", "remote_prefill_cached_tokens": 0}


def test_hold_advertises_the_engines_parallel_sizes_and_block_count() -> None:
    params = connector(tensor_parallel_size=2, block_size=16).hold("r", list(range(33)))
    assert params["tp_size"] == 2
    assert [len(g) for g in params["remote_block_ids"]] == [3]  # 33 tokens / 16 per block


def test_the_producers_own_params_are_pulled_by_a_consumer() -> None:
    c = connector()
    params = c.hold("r", [1, 2, 3])
    assert c.remote_verdict(params) == "pull"
    assert parse_remote(params) is not None


GOOD: dict[str, Any] = {"do_remote_prefill": True, "remote_block_ids": [[1, 2]],
                        "remote_engine_id": "e", "remote_request_id": "r",
                        "remote_host": "10.0.0.1", "remote_port": 5600}


@pytest.mark.parametrize("blocks", [None, [], "", 0])
def test_no_block_ids_is_the_assertion_that_kills_vllms_engine_core(blocks: Any) -> None:
    assert connector().remote_verdict({**GOOD, "remote_block_ids": blocks}) == "engine_dead"
    missing = {k: v for k, v in GOOD.items() if k != "remote_block_ids"}
    assert connector().remote_verdict(missing) == "engine_dead"
    assert connector().remote_verdict({"do_remote_prefill": True}) == "engine_dead"


@pytest.mark.parametrize("missing", ["remote_engine_id", "remote_request_id", "remote_host",
                                     "remote_port"])
def test_block_ids_without_one_address_key_are_invalid_params(missing: str) -> None:
    params = {k: v for k, v in GOOD.items() if k != missing}
    assert connector().remote_verdict(params) == "invalid"


def test_vllm_checks_the_address_keys_by_presence_only() -> None:
    """A null host is still "present" for vLLM's scheduler: the worker then fails the load."""
    params = {**GOOD, "remote_host": None, "remote_port": "5600"}
    assert connector().remote_verdict(params) == "pull"
    assert parse_remote(params) is None


@pytest.mark.parametrize("change", [
    {"remote_block_ids": [1, 2]}, {"remote_block_ids": [[-1]]},
    {"remote_block_ids": [["1"]]}, {"remote_block_ids": [[True]]},
    {"remote_engine_id": ""}, {"remote_engine_id": 7}, {"remote_request_id": None},
    {"remote_host": ["h"]}, {"remote_port": "5600"}, {"remote_port": 0},
    {"remote_port": 70000}, {"remote_port": True}, {"tp_size": 0}, {"tp_size": 2.0},
    {"pp_size": -1}, {"tp_size": 100000},
])
def test_values_a_client_got_wrong_cannot_be_pulled(change: dict[str, Any]) -> None:
    assert parse_remote({**GOOD, **change}) is None


def test_minimal_params_parse_and_missing_sizes_mean_one() -> None:
    remote = parse_remote(dict(GOOD))
    assert remote is not None and (remote.tp_size, remote.pp_size) == (1, 1)
    assert parse_remote({**GOOD, "tp_size": None}) is not None


def test_params_that_are_not_an_object_are_not_valid() -> None:
    not_a_dict: Any = [GOOD]
    assert connector().remote_verdict(not_a_dict) == "invalid"
    assert parse_remote(not_a_dict) is None
