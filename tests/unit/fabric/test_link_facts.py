"""One host's link facts in one command (Gate D and `narwhal status`): the script run by the
local shell against the loopback interface, and the reading of its sections."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from narwhal.deploy.hosts import commandline as cl

needs_ip = pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2's ip is absent")


@needs_ip
def test_one_command_reads_the_interface_every_route_and_every_tool_version() -> None:
    argv = cl.link_facts("lo", "127.0.0.1", ["127.0.0.2", "127.0.0.3"],
                         ["python3", "no-such-tool"])
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    sections = cl.parse_sections(done.stdout)
    assert [status for status, _ in sections] == [0, 0, 0, 0, 127]
    assert sections[3][1].startswith("Python 3")  # the first line of the tool's --version
    assert json.loads(sections[0][1])[0]["ifname"] == "lo"
    assert [json.loads(text)[0]["dst"] for _, text in sections[1:3]] == [
        "127.0.0.2", "127.0.0.3"]
    assert sections[4] == (127, "")  # a tool the host lacks: its own section says so


@needs_ip
def test_an_interface_the_host_lacks_fails_its_section_alone() -> None:
    argv = cl.link_facts("no-such-if0", "127.0.0.1", ["127.0.0.2"], [])
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    sections = cl.parse_sections(done.stdout)
    assert len(sections) == 2 and sections[0][0] != 0 and sections[1][0] == 0


def test_sections_end_only_at_their_own_marker_lines() -> None:
    text = "a\nb\n@@ 0\n@@ 3\nx @@ 1\n@@ 1\ntrailing"
    assert cl.parse_sections(text) == [(0, "a\nb"), (3, ""), (1, "x @@ 1")]


def test_peer_addresses_and_tools_are_arguments_never_script_text() -> None:
    argv = cl.link_facts("eth0", "10.0.0.1", ["10.0.0.2; rm -rf /"], ["$(reboot)"])
    assert argv[:2] == ["sh", "-c"] and argv[2] == cl.LINK_FACTS
    assert argv[3:] == ["sh", "eth0", "10.0.0.1", "10.0.0.2; rm -rf /", "--", "$(reboot)"]
