"""SSH destinations, URLs and engine numbers follow real grammars; one host is one host.

Issue 13 item 6, defects 6 and 7: `root@[1]`, `root@[:::::]`, `999.999.1.1` and a 23-digit
NARWHAL_NODE_<n> were accepted, and `root@10.0.0.5` vs `ssh://root@10.0.0.5:22` escaped the
port-collision check because destinations were compared as text.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from narwhal.core.errors import InputError
from narwhal.deploy.inputs import parse_inputs
from narwhal.deploy.inputs.destination import parse_destination
from tests.envtext import valid_env

BAD_DESTINATIONS = [
    "root@[1]", "root@[:::::]", "999.999.1.1", "root@256.0.0.1", "root@10.0.0", "root@10.1",
    "root@010.0.0.1", "root@1.2.3.4.5", "root@fd00::1", "ssh://root@[fd00::1", "root@[fd00::1",
    "root@-host", "root@host-", "root@ho_st", "root@" + "a" * 64 + ".example",
    "root@" + ".".join(["a" * 63] * 4), "root@host..example", "root@.host", "root@host:22",
    "ssh://root@host:0", "ssh://root@host:65536", "root@[fe80::1%$(id)]", "root@h\u0435st",
]
GOOD_DESTINATIONS = [
    ("root@10.0.0.5", "10.0.0.5", 22), ("ssh://root@10.0.0.5:2222", "10.0.0.5", 2222),
    ("ops@GPU-01.Example.com", "gpu-01.example.com", 22),
    ("root@[FD00:0:0::5]", "fd00::5", 22), ("ssh://root@[fd00::5]:22", "fd00::5", 22),
    ("gpu1", "gpu1", 22), ("root@[fe80::1%eth0]", "fe80::1%eth0", 22),
    ("root@" + ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61]), None, 22),
]
ALLOWED_FORM = "the host is an IPv4 address"


@pytest.mark.parametrize("dest", BAD_DESTINATIONS, ids=[d[:32] for d in BAD_DESTINATIONS])
def test_a_malformed_destination_is_refused_with_the_allowed_form(dest: str) -> None:
    with pytest.raises(InputError) as err:
        parse_inputs(valid_env(NARWHAL_NODE_1_SSH=dest), Path(".env"))
    lines = [p.line() for p in err.value.problems if p.field == "NARWHAL_NODE_1_SSH"]
    assert len(lines) == 1 and ALLOWED_FORM in lines[0], err.value.problems


@pytest.mark.parametrize(("dest", "host", "port"), GOOD_DESTINATIONS,
                         ids=[d[0][:32] for d in GOOD_DESTINATIONS])
def test_well_formed_destinations_are_accepted_and_canonical(dest: str, host: str | None,
                                                             port: int) -> None:
    parsed = parse_destination(dest)
    assert parsed.machine == (host or parsed.host.lower(), port)


@pytest.mark.parametrize("key", ["NARWHAL_NODE_12345678901234567890123_SSH",
                                 "NARWHAL_NODE_1000_SSH", "NARWHAL_NODE_0_SSH",
                                 "NARWHAL_NODE_007_SSH"])
def test_engine_numbers_are_1_to_999_without_leading_zeros(key: str) -> None:
    with pytest.raises(InputError) as err:
        parse_inputs(valid_env(**{key: "root@10.0.0.9"}), Path(".env"))
    lines = [p.line() for p in err.value.problems]
    assert lines == [f"{key}: engine number is not 1 to 999 without leading zeros; number "
                     "engines 1, 2, 3, ... up to 999"]


def test_engine_999_is_accepted() -> None:
    inputs = parse_inputs(valid_env(NARWHAL_NODE_999_SSH="root@10.0.0.99"), Path(".env"))
    assert [e.n for e in inputs.engines] == [1, 2, 999]


@pytest.mark.parametrize("url", ["http://999.1.1.1:8000", "http://a;b:8000", "http://[1]:8000",
                                 "http://h_st:8000", "http://user@10.0.0.1:8000"])
def test_url_hosts_follow_the_same_grammar(url: str) -> None:
    with pytest.raises(InputError) as err:
        parse_inputs(valid_env(NARWHAL_NODE_1_URL=url), Path(".env"))
    assert [p.field for p in err.value.problems] == ["NARWHAL_NODE_1_URL"]


SAME_HOST = [
    ("root@10.213.0.11", "ssh://root@10.213.0.11:22"),
    ("root@gpu-a.example", "root@GPU-A.example"),
    ("root@[fd00::11]", "ssh://root@[FD00:0:0:0:0:0:0:11]:22"),
    ("root@10.213.0.11", "ops@10.213.0.11"),
]


@pytest.mark.parametrize(("first", "second"), SAME_HOST, ids=["port-22", "case", "ipv6", "user"])
def test_one_host_written_two_ways_is_one_host_for_port_collisions(first: str,
                                                                   second: str) -> None:
    text = valid_env(NARWHAL_NODE_1_SSH=first, NARWHAL_NODE_2_SSH=second,
                     NARWHAL_NODE_1_GPU_IDS="0", NARWHAL_NODE_2_GPU_IDS="1")
    with pytest.raises(InputError) as err:
        parse_inputs(text, Path(".env"))
    fields = {p.field for p in err.value.problems}
    assert fields == {"NARWHAL_ENGINE_PORT", "NARWHAL_ATTEST_PORT",
                      "NARWHAL_NIXL_SIDE_CHANNEL_PORT"}, err.value.problems


def test_another_ssh_port_on_one_address_is_another_machine() -> None:
    text = valid_env(NARWHAL_NODE_1_SSH="ssh://root@203.0.113.7:2201",
                     NARWHAL_NODE_2_SSH="ssh://root@203.0.113.7:2202")
    assert len(parse_inputs(text, Path(".env")).engines) == 2


def test_colocated_engines_with_their_own_ports_still_pass() -> None:
    text = valid_env(NARWHAL_NODE_1_SSH="root@10.213.0.11",
                     NARWHAL_NODE_2_SSH="ssh://root@10.213.0.11:22",
                     NARWHAL_NODE_1_GPU_IDS="0", NARWHAL_NODE_2_GPU_IDS="1",
                     NARWHAL_NODE_2_ENGINE_PORT="8001", NARWHAL_NODE_2_ATTEST_PORT="8011",
                     NARWHAL_NODE_2_NIXL_SIDE_CHANNEL_PORT="5601")
    assert len(parse_inputs(text, Path(".env")).engines) == 2
