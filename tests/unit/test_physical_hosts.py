"""Roles that share one login share one SSH session, however the destination is written."""

from __future__ import annotations

from pathlib import Path

from narwhal.deploy.hosts.sessions import physical_hosts
from narwhal.deploy.inputs import parse_inputs
from tests.envtext import valid_env

COLOCATED = {"NARWHAL_NODE_1_GPU_IDS": "0", "NARWHAL_NODE_2_GPU_IDS": "1",
             "NARWHAL_NODE_2_ENGINE_PORT": "8001", "NARWHAL_NODE_2_ATTEST_PORT": "8011",
             "NARWHAL_NODE_2_NIXL_SIDE_CHANNEL_PORT": "5601",
             "NARWHAL_NODE_2_SSH_PASSWORD": None}


def test_one_login_written_two_ways_is_one_physical_host() -> None:
    text = valid_env(NARWHAL_NODE_1_SSH="root@10.213.0.11",
                     NARWHAL_NODE_2_SSH="ssh://root@10.213.0.11:22", **COLOCATED)
    hosts = physical_hosts(parse_inputs(text, Path(".env")))
    engine_hosts = [h for h in hosts if h.alias != "router"]
    assert len(engine_hosts) == 1 and len(engine_hosts[0].roles) == 2


def test_another_user_on_one_machine_gets_its_own_session() -> None:
    text = valid_env(NARWHAL_NODE_1_SSH="root@10.213.0.11",
                     NARWHAL_NODE_2_SSH="ops@10.213.0.11", **COLOCATED)
    hosts = physical_hosts(parse_inputs(text, Path(".env")))
    assert len([h for h in hosts if h.alias != "router"]) == 2
