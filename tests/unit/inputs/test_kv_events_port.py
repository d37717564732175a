"""NARWHAL_KV_EVENTS_PORT: checked like every other engine port, and refused where the launch
policy would make the engine's events a lie."""

from __future__ import annotations

from pathlib import Path

import pytest

from narwhal.core.errors import InputError
from narwhal.deploy.inputs import parse_inputs
from narwhal.deploy.inputs.kv_events import prefix_caching_on
from tests.envtext import valid_env


def _problems(**overrides: str | None) -> list[tuple[str, str, str]]:
    with pytest.raises(InputError) as err:
        parse_inputs(valid_env(**overrides), Path(".env"))
    return [(p.field, p.problem, p.fix) for p in err.value.problems]


def test_unset_means_no_events_on_any_engine() -> None:
    inputs = parse_inputs(valid_env(), Path(".env"))
    assert [e.kv_events_port for e in inputs.engines] == [None, None]


def test_a_fleet_wide_port_with_one_engine_overriding_it() -> None:
    inputs = parse_inputs(valid_env(NARWHAL_KV_EVENTS_PORT="5557",
                                    NARWHAL_NODE_2_KV_EVENTS_PORT="5558"), Path(".env"))
    assert [e.kv_events_port for e in inputs.engines] == [5557, 5558]


@pytest.mark.parametrize("value", ["0", "65536", "70000", "55 57", "5557;reboot", "$(id)",
                                   "0x15b5", "-1", "5557.0", "١٢", "9" * 40])
def test_a_port_outside_1_to_65535_or_not_a_number_is_refused_by_name(value: str) -> None:
    found = _problems(NARWHAL_KV_EVENTS_PORT=f"'{value}'")
    assert [f for f, _, _ in found] == ["NARWHAL_KV_EVENTS_PORT"], found
    assert "1 to 65535" in found[0][2]


def test_a_port_that_another_port_of_the_engine_holds_is_refused() -> None:
    found = _problems(NARWHAL_KV_EVENTS_PORT="5600")  # the NIXL side channel's
    assert any(f == "NARWHAL_KV_EVENTS_PORT" and "collides" in p for f, p, _ in found), found


def test_colocated_engines_cannot_share_an_events_port() -> None:
    found = _problems(NARWHAL_KV_EVENTS_PORT="5557", NARWHAL_NODE_2_SSH="root@10.213.0.11",
                      NARWHAL_NODE_2_SSH_PASSWORD=None, NARWHAL_NODE_1_GPU_IDS="0",
                      NARWHAL_NODE_2_GPU_IDS="1", NARWHAL_NODE_2_ENGINE_PORT="8001",
                      NARWHAL_NODE_2_ATTEST_PORT="8011",
                      NARWHAL_NODE_2_NIXL_SIDE_CHANNEL_PORT="5601")
    assert [f for f, p, _ in found if "collides" in p] == ["NARWHAL_KV_EVENTS_PORT"], found


def test_colocated_engines_with_their_own_events_ports_pass() -> None:
    inputs = parse_inputs(valid_env(
        NARWHAL_KV_EVENTS_PORT="5557", NARWHAL_NODE_2_KV_EVENTS_PORT="5558",
        NARWHAL_NODE_2_SSH="root@10.213.0.11", NARWHAL_NODE_2_SSH_PASSWORD=None,
        NARWHAL_NODE_1_GPU_IDS="0", NARWHAL_NODE_2_GPU_IDS="1",
        NARWHAL_NODE_2_ENGINE_PORT="8001", NARWHAL_NODE_2_ATTEST_PORT="8011",
        NARWHAL_NODE_2_NIXL_SIDE_CHANNEL_PORT="5601"), Path(".env"))
    assert {e.kv_events_port for e in inputs.engines} == {5557, 5558}


@pytest.mark.parametrize("args", ['["--no-enable-prefix-caching"]',
                                  '["--no_enable_prefix_caching"]',
                                  '["--enable-prefix-caching","--no-enable-prefix-caching"]'])
def test_events_with_prefix_caching_off_name_both_fields(args: str) -> None:
    found = _problems(NARWHAL_KV_EVENTS_PORT="5557", NARWHAL_ENGINE_ARGS=f"'{args}'")
    assert len(found) == 1, found
    field, problem, fix = found[0]
    assert field == "NARWHAL_ENGINE_ARGS"
    assert "NARWHAL_KV_EVENTS_PORT" in problem and "--no-enable-prefix-caching" in problem
    assert "NARWHAL_KV_EVENTS_PORT" in fix


def test_prefix_caching_off_without_events_is_the_operator_s_choice() -> None:
    inputs = parse_inputs(valid_env(NARWHAL_ENGINE_ARGS="'[\"--no-enable-prefix-caching\"]'"),
                          Path(".env"))
    assert inputs.engines[0].kv_events_port is None


def test_one_engine_s_events_judged_against_its_own_args() -> None:
    found = _problems(NARWHAL_NODE_2_KV_EVENTS_PORT="5557",
                      NARWHAL_NODE_2_ENGINE_ARGS="'[\"--no-enable-prefix-caching\"]'")
    assert [f for f, _, _ in found] == ["NARWHAL_NODE_2_ENGINE_ARGS"]
    assert "NARWHAL_NODE_2_KV_EVENTS_PORT" in found[0][1]


@pytest.mark.parametrize("args", ['["--kv-events-config","{}"]', '["--kv_events_config={}"]'])
def test_a_hand_written_kv_events_config_is_refused_for_the_port(args: str) -> None:
    found = _problems(NARWHAL_ENGINE_ARGS=f"'{args}'")
    assert [f for f, _, _ in found] == ["NARWHAL_ENGINE_ARGS"]
    assert "NARWHAL_KV_EVENTS_PORT" in found[0][2]


def test_the_last_prefix_caching_flag_wins_as_in_vllm() -> None:
    assert prefix_caching_on([])
    assert not prefix_caching_on(["--no-enable-prefix-caching"])
    assert prefix_caching_on(["--no-enable-prefix-caching", "--enable-prefix-caching"])
