"""No lab traffic leaves the namespaces: the root namespace cannot route to any lab address."""

from __future__ import annotations

import errno
import socket
import subprocess

import pytest

from narwhal.lab.plan import LabPlan
from narwhal.lab.testing import ssh


@pytest.mark.lab
def test_no_lab_address_is_routable_from_the_root_namespace(needs_lab: LabPlan) -> None:
    for h in needs_lab.hosts:
        for ip in (h.mgmt_ip, h.fabric_ip):
            done = subprocess.run(["ip", "route", "get", ip], capture_output=True, text=True, check=False)
            assert done.returncode != 0 and "No route to host" in done.stderr, (ip, done.stdout)


@pytest.mark.lab
def test_a_probe_from_the_root_namespace_fails_locally(needs_lab: LabPlan) -> None:
    target = needs_lab.host("eng1").fabric_ip
    with socket.socket() as s, pytest.raises(OSError) as err:
        s.settimeout(2)
        s.connect((target, 22))
    # EHOSTUNREACH from the local unreachable route, not a timeout on the outside network.
    assert err.value.errno == errno.EHOSTUNREACH


@pytest.mark.lab
def test_hosts_have_their_own_name_files_and_networks(needs_lab: LabPlan) -> None:
    out = ssh(needs_lab, "eng2", "hostname; cat /sys/class/net/fab0/mtu /sys/class/net/mgmt0/mtu; "
                                 "ls /tmp; ls /srv/models/tiny-llama")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[0] == "nwl-eng2"
    assert lines[1:3] == ["9000", "1500"]
    assert "config.json" in lines


@pytest.mark.lab
def test_password_host_is_reached_through_sshpass(needs_lab: LabPlan) -> None:
    out = ssh(needs_lab, "eng3", "hostname")
    assert (out.returncode, out.stdout.strip()) == (0, "nwl-eng3"), out.stderr
