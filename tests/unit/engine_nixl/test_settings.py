"""The kv_transfer_config keys the connector reads are checked, and every problem is named."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.core.errors import InputError
from narwhal.lab.engine.nixl.settings import NixlConfig, settle

BASE: dict[str, Any] = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}


def test_defaults_follow_vllm() -> None:
    s = settle(NixlConfig(BASE))
    assert (s.host, s.port, s.lease_seconds, s.enforce_compat) == ("localhost", 5600, 30.0, True)
    assert len(s.engine_id) == 36  # a uuid4, new at every start
    assert settle(NixlConfig(BASE)).engine_id != s.engine_id


def test_engine_id_extra_config_and_dp_rank_are_applied() -> None:
    kv = {**BASE, "engine_id": "prefill-1", "kv_connector_extra_config": {
        "kv_lease_duration": 2.5, "enforce_handshake_compat": False, "backends": ["UCX"]}}
    s = settle(NixlConfig(kv, side_channel_host="10.0.0.5", side_channel_port=5700,
                          data_parallel_rank=1), data_parallel_size=2)
    assert (s.engine_id, s.port, s.lease_seconds, s.enforce_compat) == (
        "prefill-1_dp1", 5701, 2.5, False)


def test_the_engines_own_id_wins_and_no_kv_config_is_refused() -> None:
    kv = {**BASE, "engine_id": "from-json"}
    assert settle(NixlConfig(kv, engine_id="fixed-at-start")).engine_id == "fixed-at-start"
    assert settle(NixlConfig(kv)).engine_id == "from-json"
    with pytest.raises(InputError, match="no KV connector"):
        settle(NixlConfig(None))


def test_the_environment_gives_the_side_channel_like_vllm() -> None:
    cfg = NixlConfig.from_env(BASE, {"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.1.0.2",
                                     "VLLM_NIXL_SIDE_CHANNEL_PORT": "5611"})
    assert (cfg.side_channel_host, cfg.side_channel_port) == ("10.1.0.2", 5611)
    with pytest.raises(InputError, match="VLLM_NIXL_SIDE_CHANNEL_PORT"):
        NixlConfig.from_env(BASE, {"VLLM_NIXL_SIDE_CHANNEL_PORT": "fifty"})


@pytest.mark.parametrize(("change", "field"), [
    ({"kv_connector": "NixlPushConnector"}, "kv_connector"),
    ({"kv_connector": None}, "kv_connector"),
    ({"kv_role": "kv_decoder"}, "kv_role"),
    ({"kv_buffer_device": "tpu"}, "kv_buffer_device"),
    ({"engine_id": ""}, "engine_id"),
    ({"kv_connector_extra_config": {"kv_lease_duration": 0}}, "kv_lease_duration"),
    ({"kv_connector_extra_config": {"kv_lease_duration": "30"}}, "kv_lease_duration"),
    ({"kv_connector_extra_config": {"kv_lease_duration": float("nan")}}, "kv_lease_duration"),
    ({"kv_connector_extra_config": {"kv_lease_duration": True}}, "kv_lease_duration"),
    ({"kv_connector_extra_config": {"enforce_handshake_compat": "false"}},
     "enforce_handshake_compat"),
    ({"kv_connector_extra_config": [1]}, "kv_connector_extra_config"),
])
def test_a_bad_value_is_refused_naming_the_key(change: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError, match=field):
        settle(NixlConfig({**BASE, **change}))


@pytest.mark.parametrize(("cfg", "field"), [
    (NixlConfig(BASE, side_channel_host=""), "VLLM_NIXL_SIDE_CHANNEL_HOST"),
    (NixlConfig(BASE, side_channel_port=65535, data_parallel_rank=1),
     "VLLM_NIXL_SIDE_CHANNEL_PORT"),
    (NixlConfig(BASE, kv_scale=0.0), "kv_scale"),
    (NixlConfig(BASE, kv_scale=float("inf")), "kv_scale"),
])
def test_a_bad_endpoint_or_scale_is_refused(cfg: NixlConfig, field: str) -> None:
    with pytest.raises(InputError, match=field):
        settle(cfg)


def test_every_problem_is_reported_at_once() -> None:
    bad = {"kv_connector": "X", "kv_role": "Y", "kv_connector_extra_config": {
        "kv_lease_duration": -1}}
    with pytest.raises(InputError) as err:
        settle(NixlConfig(bad))
    assert len(err.value.problems) == 3
