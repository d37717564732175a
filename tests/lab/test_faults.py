"""Host and network faults behave as an operator would see them, and clear restores the host."""

from __future__ import annotations

import pytest

from narwhal.lab.faults import Faults
from narwhal.lab.run import LabError
from narwhal.lab.testing import ssh


@pytest.mark.lab
def test_crash_refuses_connections_and_boot_restores_the_host(faults: Faults) -> None:
    faults.crash("eng2")
    down = ssh(faults.plan, "eng2", "true")
    assert down.returncode == 255 and "Connection refused" in down.stderr
    faults.clear()
    assert ssh(faults.plan, "eng2", "hostname").stdout.strip() == "nwl-eng2"


@pytest.mark.lab
def test_rekeyed_host_fails_strict_host_key_checking(faults: Faults) -> None:
    faults.rekey("eng1")
    out = ssh(faults.plan, "eng1", "true")
    assert out.returncode == 255 and "REMOTE HOST IDENTIFICATION HAS CHANGED" in out.stderr
    faults.clear()
    assert ssh(faults.plan, "eng1", "true").returncode == 0


@pytest.mark.lab
def test_blocked_port_is_refused_and_full_disk_gives_enospc(faults: Faults) -> None:
    plan = faults.plan
    faults.block("eng2", 5201)
    faults.fill("eng1")
    eng2 = plan.host("eng2").fabric_ip
    out = ssh(plan, "eng2", f"iperf3 -s -1 -B {eng2} -D --pidfile /tmp/b.pid")
    assert out.returncode == 0
    probe = ssh(plan, "eng1", f"iperf3 -c {eng2} -t 1 -J | grep -c 'Connection refused'; "
                              f"{{ echo x > {plan.spec.run_dir}/new; }} 2>&1 || echo full")
    assert probe.stdout.split()[0] == "1" and "No space left on device" in probe.stdout, probe.stdout
    ssh(plan, "eng2", "kill $(cat /tmp/b.pid)")


@pytest.mark.lab
def test_an_isolated_host_is_cut_both_ways_until_cleared_and_keeps_running(
        faults: Faults) -> None:
    plan = faults.plan
    start = ssh(plan, "eng3", "setsid -f sleep 300 >/dev/null 2>&1 </dev/null; sleep 0.1; "
                              "ps -o pid= -C sleep | head -1")
    pid = int(start.stdout.split()[0])
    fault = faults.isolate("eng3")
    assert ssh(plan, "eng3", "true", timeout=20).returncode != 0  # management: cut
    eng3 = plan.host("eng3").fabric_ip
    probe = ssh(plan, "eng1", f"timeout 3 bash -c 'echo > /dev/tcp/{eng3}/22' && echo open "
                              "|| echo cut", timeout=20)
    assert probe.stdout.strip() == "cut"  # fabric: cut
    faults.clear(fault["id"])
    assert ssh(plan, "eng3", f"kill -0 {pid} && echo alive; kill {pid}").stdout.strip() == \
        "alive"  # a partition, not a crash


@pytest.mark.lab
def test_kill_ends_one_process_by_its_pid_on_that_host(faults: Faults) -> None:
    start = ssh(faults.plan, "eng3", "setsid -f sleep 300 >/dev/null 2>&1 </dev/null; sleep 0.1; "
                                     "ps -o pid= -C sleep | head -1")
    pid = int(start.stdout.split()[0])
    faults.kill("eng3", pid)
    assert ssh(faults.plan, "eng3", f"sleep 0.2; kill -0 {pid}").returncode != 0


@pytest.mark.lab
def test_python_fault_changes_only_that_hosts_logins_and_clear_restores_them(faults: Faults) -> None:
    ask = "python3 -c 'import platform, sys; print(platform.python_version(), sys.version_info[:2])'"
    before = ssh(faults.plan, "eng3", ask).stdout.split()[0]
    faults.python("eng3", "3.10.12")
    assert ssh(faults.plan, "eng3", ask).stdout.strip() == "3.10.12 (3, 10)"
    assert ssh(faults.plan, "eng1", ask).stdout.split()[0] == before  # other hosts untouched
    with pytest.raises(LabError, match="not a version"):
        faults.python("eng3", "3.10; reboot")
    faults.clear()
    assert ssh(faults.plan, "eng3", ask).stdout.split()[0] == before
