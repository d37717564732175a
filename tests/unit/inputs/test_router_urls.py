"""NARWHAL_ROUTER_URL and NARWHAL_ROUTER_STANDBY_URL: addresses on the router host, each an
http://HOST:PORT, and never the same address (two routers cannot bind one port)."""

from __future__ import annotations

from pathlib import Path

import pytest

from narwhal.core.errors import InputError
from narwhal.deploy.gates.registry import env_fingerprints
from narwhal.deploy.inputs import parse_inputs
from tests.envtext import valid_env

SOURCE = Path(".env")


def _problems(text: str) -> dict[str, str]:
    with pytest.raises(InputError) as caught:
        parse_inputs(text, SOURCE)
    return {p.field: p.problem for p in caught.value.problems}


def test_a_standby_address_is_read_and_moves_gate_gs_router_input() -> None:
    plain = parse_inputs(valid_env(), SOURCE)
    with_standby = parse_inputs(valid_env(NARWHAL_ROUTER_STANDBY_URL="http://127.0.0.1:8001"),
                                SOURCE)
    assert plain.router.standby_url is None
    assert with_standby.router.standby_url == "http://127.0.0.1:8001"
    assert env_fingerprints(plain)["serve"] != env_fingerprints(with_standby)["serve"]
    assert env_fingerprints(plain)["preflight"] == env_fingerprints(with_standby)["preflight"]


@pytest.mark.parametrize("value", [
    "http://127.0.0.1:8000",  # the router's own default address
    "http://127.0.0.1:8000/",
    "HTTP://127.0.0.1:8000",
])
def test_a_standby_on_the_routers_own_address_is_refused(value: str) -> None:
    found = _problems(valid_env(NARWHAL_ROUTER_STANDBY_URL=value))
    assert "is the router's own address" in found.get("NARWHAL_ROUTER_STANDBY_URL", ""), found


def test_a_standby_on_an_explicit_router_address_is_refused() -> None:
    found = _problems(valid_env(NARWHAL_ROUTER_URL="http://127.0.0.1:9000",
                                NARWHAL_ROUTER_STANDBY_URL="http://127.0.0.1:9000"))
    assert "NARWHAL_ROUTER_STANDBY_URL" in found, found


@pytest.mark.parametrize("value", [
    "127.0.0.1:8001",  # no scheme
    "https://127.0.0.1:8001",
    "http://127.0.0.1",  # no port
    "http://127.0.0.1:80010",
    "http://user:pw@127.0.0.1:8001",  # credentials smuggled in
    "http://127.0.0.1:8001/v1",  # a path
    "http://127.0.0.1:8001?x=1",
    "http://;rm -rf /:8001",  # a host no resolver accepts
    "http://" + "a" * 5000 + ":8001",  # without bound
])
def test_a_malformed_standby_address_is_refused_by_name(value: str) -> None:
    found = _problems(valid_env(NARWHAL_ROUTER_STANDBY_URL=value))
    [named] = [k for k in found if k.startswith("NARWHAL_ROUTER_STANDBY_URL")]  # or its line
    assert len(found[named]) < 600, found
