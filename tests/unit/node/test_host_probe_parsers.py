"""Each half of the discovery probe: the pure parsers on real captured output, and each
command's collector with the real tool's reply (a lab double or a replayed capture) on PATH.

The H200 capture (tests/fixtures/h200-host) and the lab's nvidia-smi double must come out as
the same GPU list, so what discovery learns in the lab is what it learns on a real host.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from narwhal.lab import identity
from narwhal.lab.doubles import docker_cli
from narwhal.node import host_probe as hp
from tests.unit.node.helpers import (
    AMD,
    CAPTURES,
    H200_FIELDS,
    LAB_IMAGE,
    NO_DRIVER,
    capture,
    h200_hardware,
    host_dir,
    inject_failure,
    install_double,
    install_replay,
    mi300x_hardware,
    sys_pci,
)

H200_GPU = {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-00000000-0000-0000-0000-000000000001",
            "pci_bus_id": "0000:00:06.0", "memory_total_mib": 143771, "numa_node": None}
MI300X_BUSES = ["0000:11:00.0", "0000:2f:00.0", "0000:48:00.0", "0000:5a:00.0",
                "0000:8e:00.0", "0000:ac:00.0", "0000:c4:00.0", "0000:d6:00.0"]


def _tools(**paths: str | None) -> dict[str, dict[str, str | None]]:
    tools: dict[str, dict[str, str | None]] = {n: {"path": None, "version": None} for n in hp.TOOLS}
    for name, path in paths.items():
        tools[name.replace("_", "-")]["path"] = path
    return tools


# --- NVIDIA -------------------------------------------------------------------------------

def test_the_real_h200_query_parses_into_one_gpu_with_sysfs_bus_id_and_driver() -> None:
    out, _, rc = capture("nvidia-smi-query-csv-noheader-nounits")
    gpus, driver = hp.parse_nvidia_smi_csv(out, H200_FIELDS)
    assert rc == 0
    assert gpus == [H200_GPU]
    assert driver == "580.159.04"


def test_the_lab_double_answers_the_probes_query_as_the_real_h200_does(tmp_path: Path) -> None:
    """Same spec as the capture -> same GPU list, through the probe's own query and collector."""
    real, _ = hp.parse_nvidia_smi_csv(capture("nvidia-smi-query-csv-noheader-nounits")[0], H200_FIELDS)
    tool = install_double(tmp_path / "bin", "nvidia-smi", "nvidia_smi",
                          host_dir(tmp_path / "host", h200_hardware()))
    # The capture's sysfs line: `0000:00:06.0 ... numa=-1` (a VM: no NUMA affinity).
    assert "0000:00:06.0" in capture("sys-pci-nvidia")[0] and "numa=-1" in capture("sys-pci-nvidia")[0]
    facts = hp.nvidia_facts(str(tool), str(sys_pci(tmp_path / "sys", "0000:00:06.0", "-1")))
    assert facts == {"vendor": "nvidia", "gpus": real, "driver_version": "580.159.04", "error": None}


def test_numa_node_comes_from_the_gpus_pci_device_in_sysfs(tmp_path: Path) -> None:
    tool = install_double(tmp_path / "bin", "nvidia-smi", "nvidia_smi",
                          host_dir(tmp_path / "host", h200_hardware()))
    facts = hp.nvidia_facts(str(tool), str(sys_pci(tmp_path / "sys", "0000:00:06.0", "1")))
    assert facts["gpus"][0]["numa_node"] == 1
    assert hp.parse_numa_node("-1\n") is None and hp.parse_numa_node(None) is None


def test_nvidia_smi_without_a_driver_is_a_fact_with_its_own_words_not_a_crash(tmp_path: Path) -> None:
    hdir = host_dir(tmp_path / "host", h200_hardware())
    inject_failure(hdir, "nvidia-smi", 9, NO_DRIVER + "\n")
    tool = install_double(tmp_path / "bin", "nvidia-smi", "nvidia_smi", hdir)
    facts = hp.nvidia_facts(str(tool), str(tmp_path / "sys"))
    assert facts["gpus"] == [] and facts["vendor"] == "nvidia"
    assert facts["error"] == f"nvidia-smi exited 9: {NO_DRIVER}"


def test_nvidia_smi_printing_its_failure_on_stdout_is_reported_too(tmp_path: Path) -> None:
    tool = install_replay(tmp_path / "bin", "nvidia-smi", NO_DRIVER + "\n\n", "", 9)
    assert hp.nvidia_facts(str(tool))["error"] == f"nvidia-smi exited 9: {NO_DRIVER}"


@pytest.mark.parametrize("garbage", [
    "garbage\n",
    "0, NVIDIA H200, GPU-00000000-0000-0000-0000-000000000001, 00000000:00:06.0, [N/A], 580.159.04\n",
    "0, NVIDIA H200, not-a-uuid, 00000000:00:06.0, 143771, 580.159.04\n",
    "0, NVIDIA H200, GPU-00000000-0000-0000-0000-000000000001, 06.0, 143771, 580.159.04\n",
])
def test_unreadable_nvidia_smi_output_names_the_line_and_leaves_no_gpus(tmp_path: Path, garbage: str) -> None:
    with pytest.raises(ValueError, match="line 1"):
        hp.parse_nvidia_smi_csv(garbage)
    facts = hp.nvidia_facts(str(install_replay(tmp_path / "bin", "nvidia-smi", garbage)))
    assert facts["gpus"] == [] and facts["error"].startswith("nvidia-smi output not understood: line 1")


def test_a_host_with_nvidia_devices_but_no_nvidia_smi_says_so(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").write_text("")
    facts = hp.accelerator_facts(_tools(), str(tmp_path / "sys"), str(tmp_path / "dev"))
    assert facts["vendor"] == "nvidia" and facts["gpus"] == []
    assert "nvidia-smi is not on PATH" in facts["error"]


def test_a_host_without_accelerators_reports_no_vendor_and_no_error(tmp_path: Path) -> None:
    assert hp.accelerator_facts(_tools(), str(tmp_path / "sys"), str(tmp_path / "dev")) == {
        "vendor": None, "gpus": [], "driver_version": None, "error": None}


def test_device_nodes_of_the_h200_capture(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in capture("dev-nvidia")[0].split():
        if name == "nvidia-caps":
            (dev / name).mkdir()
            (dev / name / "nvidia-cap1").write_text("")
        else:
            (dev / name).write_text("")
    (dev / "null").write_text("")
    assert hp.device_nodes(str(dev)) == ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-uvm",
                                         "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidiactl"]


# --- AMD ----------------------------------------------------------------------------------

def _kfd_files() -> dict[str, str]:
    nodes = AMD / "sys" / "class" / "kfd" / "kfd" / "topology" / "nodes"
    return {p.name: (p / "properties").read_text() for p in nodes.iterdir()}


def test_rocminfo_of_an_mi300x_host_lists_its_eight_gpu_agents_not_its_cpus() -> None:
    agents, rock = hp.parse_rocminfo((AMD / "rocminfo.out").read_text())
    assert rock == "6.8.5"
    assert [a["name"] for a in agents] == ["AMD Instinct MI300X"] * 8
    assert [a["node"] for a in agents] == list(range(2, 10))
    assert agents[0] == {"node": 2, "name": "AMD Instinct MI300X", "uuid": "GPU-0c4a7f2e1b9d3a58",
                         "bdfid": 0x11 << 8, "memory_total_mib": 200998912 // 1024}


def test_kfd_topology_gives_the_gpu_nodes_with_bdf_domain_and_render_minor() -> None:
    nodes = hp.parse_kfd_topology(_kfd_files())
    assert [n["node"] for n in nodes] == list(range(2, 10))
    assert [n["drm_render_minor"] for n in nodes] == list(range(128, 136))
    assert {n["gfx_target_version"] for n in nodes} == {90402}
    agents, _ = hp.parse_rocminfo((AMD / "rocminfo.out").read_text())
    # rocminfo's Uuid is the KFD unique_id in hex; its BDFID is the KFD location_id.
    assert [f"GPU-{n['unique_id']:016x}" for n in nodes] == [a["uuid"] for a in agents]
    assert [n["location_id"] for n in nodes] == [a["bdfid"] for a in agents]


def test_the_mi300x_host_parses_into_gpus_with_bus_ids_numa_and_device_nodes(tmp_path: Path) -> None:
    rocminfo = install_replay(tmp_path / "bin", "rocminfo", (AMD / "rocminfo.out").read_text())
    facts = hp.accelerator_facts(_tools(rocminfo=str(rocminfo)), str(AMD / "sys"), str(AMD / "dev"))
    assert facts["vendor"] == "amd" and facts["error"] is None
    assert facts["driver_version"] == "6.8.5"
    assert [g["pci_bus_id"] for g in facts["gpus"]] == MI300X_BUSES
    assert [g["numa_node"] for g in facts["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g["index"] for g in facts["gpus"]] == list(range(8))
    assert {g["memory_total_mib"] for g in facts["gpus"]} == {196288}
    # the fixture's sysfs has no drm/ dirs, so each render node comes from its KFD node
    assert [g["render_node"] for g in facts["gpus"]] == [f"/dev/dri/renderD{128 + i}"
                                                         for i in range(8)]
    assert hp.device_nodes(str(AMD / "dev")) == (
        ["/dev/dri/card0"] + [f"/dev/dri/card{i}" for i in range(1, 9)]
        + [f"/dev/dri/renderD{128 + i}" for i in range(8)] + ["/dev/kfd"])


def test_the_render_node_is_the_one_sysfs_lists_under_the_gpus_pci_device(tmp_path: Path) -> None:
    drm = tmp_path / "bus" / "pci" / "devices" / "0000:11:00.0" / "drm"
    for name in ("card3", "renderD131"):
        (drm / name).mkdir(parents=True)
    assert hp.render_node(str(tmp_path), "0000:11:00.0", 128) == "/dev/dri/renderD131"
    assert hp.render_node(str(tmp_path), "0000:12:00.0", 129) == "/dev/dri/renderD129"
    assert hp.render_node(str(tmp_path), "0000:12:00.0") is None


def test_the_bmc_vga_is_not_taken_for_an_accelerator_vendor() -> None:
    assert hp.pci_accelerator_vendors(str(AMD / "sys")) == {"0x1002", "0x1a03"}
    assert hp.accelerator_facts(_tools(), str(AMD / "sys"), str(AMD / "dev"))["vendor"] == "amd"


def test_the_pci_domain_comes_from_kfd_because_rocminfo_does_not_print_it() -> None:
    agents = [{"node": 2, "name": "x", "uuid": "GPU-1", "bdfid": (0xC3 << 8) | (1 << 3) | 2,
               "memory_total_mib": 1}]
    kfd = [{"node": 2, "location_id": agents[0]["bdfid"], "domain": 1}]
    assert hp.amd_gpus(agents, kfd)[0]["pci_bus_id"] == "0001:c3:01.2"
    assert hp.amd_gpus(agents, [])[0]["pci_bus_id"] == "0000:c3:01.2"


def test_rocminfo_and_kfd_disagreeing_on_the_gpu_count_is_an_error(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    nodes = sys_root / "class" / "kfd" / "kfd" / "topology" / "nodes"
    for node, text in list(_kfd_files().items())[:5]:
        (nodes / node).mkdir(parents=True)
        (nodes / node / "properties").write_text(text)
    rocminfo = install_replay(tmp_path / "bin", "rocminfo", (AMD / "rocminfo.out").read_text())
    facts = hp.amd_facts(str(rocminfo), str(sys_root))
    assert "rocminfo lists 8 GPU agents but the KFD topology has" in facts["error"]


def test_the_lab_rocminfo_double_parses_to_its_specs_uuids_and_bus_ids(tmp_path: Path) -> None:
    hardware = mi300x_hardware()
    tool = install_double(tmp_path / "bin", "rocminfo", "rocminfo", host_dir(tmp_path / "host", hardware))
    facts = hp.amd_facts(str(tool), str(tmp_path / "sys"))
    assert facts["error"] is None and facts["driver_version"] == "6.7.0"
    assert [(g["uuid"], g["pci_bus_id"], g["memory_total_mib"]) for g in facts["gpus"]] == [
        (d.uuid, identity.sysfs_bus_id(d.pci_bus_id), 196288) for d in hardware.accelerators.devices]


@pytest.mark.parametrize("text", ["", "ROCk module is loaded\nno agents here\n"])
def test_output_that_is_not_rocminfo_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not rocminfo output"):
        hp.parse_rocminfo(text)


def test_rocminfo_missing_on_an_amd_host_is_reported(tmp_path: Path) -> None:
    facts = hp.accelerator_facts(_tools(), str(AMD / "sys"), str(AMD / "dev"))
    assert facts["gpus"] == [] and "rocminfo is not on PATH" in facts["error"]


# --- network ------------------------------------------------------------------------------

def _by_name(interfaces: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {i["name"]: i for i in interfaces}


def test_ip_json_gives_the_fabric_interface_mtu_state_and_addresses() -> None:
    interfaces = _by_name(hp.parse_ip_addr_json((CAPTURES / "ip-j-addr.out").read_text()))
    assert sorted(interfaces) == ["fab0", "fab0p", "lo", "mgmt0", "mgmt0p"]
    fab = interfaces["fab0"]
    assert (fab["mtu"], fab["operstate"]) == (9000, "UP")
    assert fab["addresses"][:2] == [
        {"family": "inet", "address": "10.99.0.5", "prefixlen": 24, "scope": "global"},
        {"family": "inet6", "address": "fd00::5", "prefixlen": 64, "scope": "global"}]
    assert fab["addresses"][2]["scope"] == "link"
    assert (interfaces["mgmt0"]["operstate"], interfaces["mgmt0"]["addresses"][0]["address"]) == (
        "DOWN", "10.98.0.5")


def test_proc_if_inet6_agrees_with_ip_json_on_every_ipv6_address() -> None:
    """The fallback for hosts without `ip` (like the H200 capture's) reads the same facts."""
    from_ip = {name: [a for a in i["addresses"] if a["family"] == "inet6"]
               for name, i in _by_name(hp.parse_ip_addr_json((CAPTURES / "ip-j-addr.out").read_text())).items()}
    from_proc = hp.parse_if_inet6((CAPTURES / "proc-net-if_inet6.out").read_text())

    def key(a: dict[str, Any]) -> str:
        return str(a["address"])

    assert {n: sorted(a, key=key) for n, a in from_proc.items()} == {
        n: sorted(a, key=key) for n, a in from_ip.items() if a}


def test_without_ip_the_interfaces_come_from_sysfs() -> None:
    assert capture("ip-j-addr")[1].strip() == "ip: command not found"  # as on the H200 host
    lo = _by_name(hp.interface_facts(None))["lo"]
    assert lo["mtu"] == 65536 and lo["operstate"] == "UNKNOWN"
    assert {"family": "inet", "address": "127.0.0.1", "prefixlen": 8, "scope": "host"} in lo["addresses"]


@pytest.mark.parametrize("text", ["not json", "{}", '[{"ifname": "x"}]extra',
                                  '[{"ifname": "x", "addr_info": [{"family": "inet", "local": "10.0.0.1"}]}]'])
def test_ip_output_that_is_not_a_json_list_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        hp.parse_ip_addr_json(text)


def test_ss_names_the_owner_of_each_requested_port_and_nothing_else() -> None:
    rows = hp.parse_ss_listeners((CAPTURES / "ss-H-ltnp.out").read_text(), [8000, 8010, 5600, 5601, 22])
    assert [(r["port"], r["address"], r["process"]) for r in rows] == [
        (5600, "10.99.0.5", "python3"), (5601, "fd00::5", "python3"),
        (8000, "0.0.0.0", "python3"), (8010, "::", "python3")]
    # Two processes share each socket (a fork); ss lists the child first and so do we.
    assert {r["pid"] for r in rows} == {25889}


def test_the_kernels_socket_table_finds_the_same_listeners_as_ss() -> None:
    ports = [8000, 8010, 5600, 5601, 9000]
    text = (CAPTURES / "proc-net-tcp.out").read_text() + (CAPTURES / "proc-net-tcp6.out").read_text()
    from_proc = hp.parse_proc_net_tcp(text, ports)
    from_ss = hp.parse_ss_listeners((CAPTURES / "ss-H-ltnp.out").read_text(), ports)
    assert [(r["port"], r["address"]) for r in from_proc] == [(r["port"], r["address"]) for r in from_ss]
    assert {(r["process"], r["pid"]) for r in from_proc} == {(None, None)}


def test_without_ss_listeners_come_from_proc(tmp_path: Path) -> None:
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "tcp").write_text((CAPTURES / "proc-net-tcp.out").read_text())
    rows = hp.listener_facts(None, [9000, 22], str(tmp_path))
    assert rows == [{"port": 9000, "address": "127.0.0.1", "process": None, "pid": None}]
    assert hp.listener_facts(None, [], str(tmp_path)) == []


def test_an_unreadable_ss_line_is_refused_with_its_number() -> None:
    with pytest.raises(ValueError, match="ss line 2"):
        hp.parse_ss_listeners("LISTEN 0 16 0.0.0.0:8000 0.0.0.0:*\nbogus\n", [8000])


def test_rdma_ports_report_state_link_layer_and_populated_gids(tmp_path: Path) -> None:
    port = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    for sub in ("gids", "gid_attrs/types"):
        (port / sub).mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "link_layer").write_text("Ethernet\n")
    gids = {0: ("fe80:0000:0000:0000:3a9d:edff:fe16:8def", "IB/RoCE v1"),
            1: ("fe80:0000:0000:0000:3a9d:edff:fe16:8def", "RoCE v2"),
            3: ("0000:0000:0000:0000:0000:ffff:0ad6:000b", "RoCE v2"),
            4: ("0000:0000:0000:0000:0000:0000:0000:0000", None)}
    for i, (gid, kind) in gids.items():
        (port / "gids" / str(i)).write_text(gid + "\n")
        if kind:
            (port / "gid_attrs" / "types" / str(i)).write_text(kind + "\n")
    assert hp.rdma_facts(str(tmp_path)) == [{"device": "mlx5_0", "ports": [{
        "port": 1, "state": "ACTIVE", "link_layer": "Ethernet", "gids": [
            {"index": 0, "gid": "fe80::3a9d:edff:fe16:8def", "type": "IB/RoCE v1"},
            {"index": 1, "gid": "fe80::3a9d:edff:fe16:8def", "type": "RoCE v2"},
            {"index": 3, "gid": "::ffff:10.214.0.11", "type": "RoCE v2"}]}]}]
    assert hp.rdma_facts(str(tmp_path / "none")) == []


# --- image, host, tools -------------------------------------------------------------------

def test_image_inspect_of_the_docker_double_gives_its_id_and_digests(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hdir = host_dir(tmp_path / "host", None, (LAB_IMAGE,))
    assert docker_cli.main(str(hdir), ["image", "inspect", identity.image_id(LAB_IMAGE)]) == 0
    image_id, digests = hp.parse_image_inspect(capsys.readouterr().out)
    assert image_id == identity.image_id(LAB_IMAGE)
    assert digests == [identity.repo_digest(LAB_IMAGE)]


def test_podman_style_bare_hex_ids_are_given_their_algorithm() -> None:
    text = json.dumps([{"Id": "ab" * 32, "RepoDigests": None}])
    assert hp.parse_image_inspect(text) == ("sha256:" + "ab" * 32, [])


@pytest.mark.parametrize("text", ["[]", "garbage", '[{"RepoDigests": []}]'])
def test_image_inspect_output_without_one_image_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        hp.parse_image_inspect(text)


def test_docker_without_its_daemon_is_a_fact_in_the_image_facts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, err, rc = capture("docker-image-inspect-no-daemon", CAPTURES)
    install_replay(tmp_path / "bin", "docker", out, err, rc)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    facts = hp.image_facts("narwhal-lab/vllm-emulator:v0.32.0", "docker")
    assert (facts["found"], facts["id"]) == (False, None)
    assert facts["error"] == ("docker exited 1: Cannot connect to the Docker daemon at "
                              "unix:///var/run/docker.sock. Is the docker daemon running?")
    assert facts["packages"] == {"vllm": None, "torch": None, "nixl": None}


def test_the_image_and_its_packages_through_the_docker_double(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The double runs the image's python3 (the host's, which has none of the packages)."""
    hdir = host_dir(tmp_path / "host", None, (LAB_IMAGE,))
    install_double(tmp_path / "bin", "docker", "docker_cli", hdir)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    facts = hp.image_facts(f"{LAB_IMAGE.repository}:{LAB_IMAGE.tag}", "docker")
    assert facts == {"ref": f"{LAB_IMAGE.repository}:{LAB_IMAGE.tag}", "id": identity.image_id(LAB_IMAGE),
                     "repo_digests": [identity.repo_digest(LAB_IMAGE)], "found": True, "error": None,
                     "packages": {"vllm": None, "torch": None, "nixl": None}}
    missing = hp.image_facts("nosuch:latest", "docker")
    assert not missing["found"] and missing["error"] == "docker exited 1: Error: No such image: nosuch:latest"


def test_an_image_that_cannot_run_python_keeps_its_identity_and_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hdir = host_dir(tmp_path / "host", None, (LAB_IMAGE,))
    install_double(tmp_path / "bin", "docker", "docker_cli", hdir)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setattr(hp, "PACKAGE_SNIPPET", "raise SystemExit(3)")  # an image whose python3 fails
    facts = hp.image_facts(identity.image_id(LAB_IMAGE), "docker")
    assert facts["found"] and facts["id"] == identity.image_id(LAB_IMAGE)
    assert facts["packages"] == {"vllm": None, "torch": None, "nixl": None}
    assert facts["error"].startswith("package versions unknown: docker exited 3")


def test_a_runtime_not_on_path_and_no_runtime_are_both_facts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert hp.image_facts("x:1", "podman")["error"] == "podman is not on PATH"
    assert hp.image_facts("x:1", None)["error"] == "the request names an image but no container runtime"


def test_package_versions_line() -> None:
    line = 'noise\nNARWHAL_PACKAGES {"nixl": null, "torch": "2.9.0", "vllm": "0.29.0"}\n'
    assert hp.parse_package_versions(line) == {"vllm": "0.29.0", "torch": "2.9.0", "nixl": None}
    with pytest.raises(ValueError, match="no NARWHAL_PACKAGES line"):
        hp.parse_package_versions("python3: not found\n")


def test_os_release_of_the_h200_host() -> None:
    assert hp.parse_os_release(capture("os-release")[0]) == {
        "ID": "ubuntu", "VERSION_ID": "24.04", "PRETTY_NAME": "Ubuntu 24.04.3 LTS"}
    assert hp.parse_os_release("") == {"ID": None, "VERSION_ID": None, "PRETTY_NAME": None}


def test_tool_versions_from_each_tools_real_version_output() -> None:
    captured = json.loads((CAPTURES / "tool-versions.json").read_text())
    versions = {t: hp.parse_tool_version(c["stdout"] or c["stderr"]) for t, c in captured.items()}
    assert versions == {"python3": "3.11.7", "git": "2.39.5", "make": "4.3", "curl": "7.88.1",
                        "docker": "28.2.2", "iperf3": "3.12", "ss": "6.1.0", "ip": "6.1.0",
                        "sshpass": "1.09"}
    assert all(captured[t]["argv"][1:] == (hp.VERSION_ARGS.get(t) or ["--version"]) for t in captured)
    assert hp.parse_tool_version("") is None


def test_a_missing_tool_has_a_null_path_and_a_present_one_its_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools_out = capture("tools")[0]
    assert "lspci MISSING" in tools_out and "docker MISSING" in tools_out  # the H200 host lacked them
    install_replay(tmp_path, "git", "git version 2.39.5\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert hp.tool_facts("lspci") == {"path": None, "version": None}
    assert hp.tool_facts("git") == {"path": str(tmp_path / "git"), "version": "2.39.5"}


def test_a_tool_that_fails_its_version_flag_is_present_without_a_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, _, rc = capture("nvidia-smi-bad-flag")  # what an unknown flag gets from real nvidia-smi
    install_replay(tmp_path, "nvidia-smi", out, "", rc)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert hp.tool_facts("nvidia-smi") == {"path": str(tmp_path / "nvidia-smi"), "version": None}


def test_a_command_that_hangs_is_killed_and_reported(tmp_path: Path) -> None:
    script = tmp_path / "hang"
    script.write_text("#!/bin/sh\nsleep 30 &\nwait\n")
    script.chmod(0o755)
    ran = hp.run([str(script)], timeout=0.3)
    assert ran.rc is None and ran.problem() == "hang timed out after 0.3 s"
    assert hp.run([str(tmp_path / "absent")]).problem().startswith("absent could not start")


def test_disk_facts_for_present_and_missing_paths(tmp_path: Path) -> None:
    present = hp.disk_facts(str(tmp_path))
    assert present["exists"] and present["is_dir"] and present["writable"]
    assert isinstance(present["free_bytes"], int) and present["free_bytes"] > 0
    assert hp.disk_facts(str(tmp_path / "absent")) == {
        "exists": False, "is_dir": False, "free_bytes": None, "writable": False}


# --- the checkpoint tree ------------------------------------------------------------------

def _model(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}\n')
    (root / "tokenizer_config.json").write_text("{}\n")
    (root / "sub" / "weights.bin").write_bytes(bytes(range(256)) * 5000)
    return root


def test_tree_digest_is_the_sha256_of_the_sorted_rows_as_documented(tmp_path: Path) -> None:
    facts = hp.model_facts(str(_model(tmp_path / "m")), True)
    rows = "".join(f"{p}\t{s}\t{h}\n" for p, s, h in sorted(facts["rows"]))
    assert facts["model_tree_sha256"] == hashlib.sha256(rows.encode()).hexdigest()
    assert [r[0] for r in facts["rows"]] == ["config.json", "sub/weights.bin", "tokenizer_config.json"]
    big = tmp_path / "m" / "sub" / "weights.bin"
    assert facts["rows"][1] == ["sub/weights.bin", 1_280_000, hashlib.sha256(big.read_bytes()).hexdigest()]
    assert (facts["files"], facts["bytes"]) == (3, sum(r[1] for r in facts["rows"]))
    assert facts["config_sha256"] == hashlib.sha256((tmp_path / "m" / "config.json").read_bytes()).hexdigest()
    assert facts["architectures"] == ["LlamaForCausalLM"] and not facts["needs_trust_remote_code"]


def test_readme_cache_and_git_are_not_part_of_the_checkpoint(tmp_path: Path) -> None:
    root = _model(tmp_path / "m")
    before = hp.model_facts(str(root), True)["model_tree_sha256"]
    for rel in ("README.md", ".cache/huggingface/download/x.lock", ".git/HEAD", "sub/README"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("anything")
    assert hp.model_facts(str(root), True)["model_tree_sha256"] == before


def test_a_file_that_changes_while_hashed_is_an_error_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _model(tmp_path / "m")
    real = hp._hash_stream

    def with_a_writer(f: Any) -> tuple[int, str]:
        result = real(f)
        if f.name.endswith("weights.bin"):  # a download still appending to this file
            with open(f.name, "ab") as w:
                w.write(b"more")
        return result

    monkeypatch.setattr(hp, "_hash_stream", with_a_writer)
    facts = hp.model_facts(str(root), True)
    assert facts["model_tree_sha256"] is None
    assert facts["error"].startswith("sub/weights.bin: changed while it was hashed")


def test_remote_code_is_flagged_by_auto_map_or_a_python_file(tmp_path: Path) -> None:
    root = _model(tmp_path / "m")
    (root / "config.json").write_text('{"auto_map": {"AutoConfig": "x.Config"}}')
    assert hp.model_facts(str(root), False)["needs_trust_remote_code"]
    (root / "config.json").write_text("{}")
    (root / "modeling_x.py").write_text("")
    assert hp.model_facts(str(root), False)["needs_trust_remote_code"]


def test_without_hashing_the_tree_is_counted_but_not_digested(tmp_path: Path) -> None:
    facts = hp.model_facts(str(_model(tmp_path / "m")), False)
    assert (facts["files"], facts["rows"], facts["model_tree_sha256"], facts["error"]) == (3, [], None, None)


def test_a_missing_model_dir_is_a_fact(tmp_path: Path) -> None:
    facts = hp.model_facts(str(tmp_path / "absent"), True)
    assert not facts["exists"] and facts["error"] == f"{tmp_path / 'absent'} does not exist"


def test_symlinks_inside_the_tree_are_followed_and_broken_ones_named(tmp_path: Path) -> None:
    root = _model(tmp_path / "m")
    plain = {r[0]: r[1:] for r in hp.model_facts(str(root), True)["rows"]}
    (root / "sub" / "weights.bin").rename(root / "blob.bin")
    (root / "sub" / "weights.bin").symlink_to("../blob.bin")
    linked = hp.model_facts(str(root), True)
    rows = {r[0]: r[1:] for r in linked["rows"]}
    assert rows["sub/weights.bin"] == rows["blob.bin"] == plain["sub/weights.bin"]
    assert linked["error"] is None and linked["model_tree_sha256"] is not None
    (root / "dangling").symlink_to("nothing-here")
    broken = hp.model_facts(str(root), True)
    assert broken["error"] == "dangling: broken symlink (-> nothing-here)"
    assert broken["model_tree_sha256"] is None


def test_a_folder_that_cannot_be_listed_is_an_error_not_a_smaller_digest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _model(tmp_path / "m")
    real = os.listdir

    def refusing(path: Any) -> list[str]:
        if str(path).endswith("/sub"):
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(os, "listdir", refusing)
    facts = hp.model_facts(str(root), True)
    assert facts["error"] == "sub: cannot list (Permission denied)"
    assert facts["model_tree_sha256"] is None


# --- machine identity ---------------------------------------------------------------------


def test_the_machine_id_is_reported_keyed_never_as_itself() -> None:
    """One digest per OS install, whichever login or address read it; machine-id(5) asks that
    the id itself not leave the host, so it is HMAC'd under Narwhal's label as systemd's
    app-specific ids are."""
    import hmac

    machine_id = "4c4c4544004b4a1080335ac04f4d3332"
    digest = hp.machine_id_digest(machine_id + "\n")
    assert digest == hmac.new(machine_id.encode(), b"narwhal.machine", hashlib.sha256).hexdigest()
    assert machine_id not in str(digest) and hp.machine_id_digest(machine_id.upper()) == digest
    # absent, empty (an image before first boot), systemd's first-boot marker, not an id
    for text in (None, "", "uninitialized\n", "not-a-machine-id", machine_id[:-1]):
        assert hp.machine_id_digest(text) is None


def test_the_document_carries_the_machine_digest_from_etc_machine_id(
        monkeypatch: pytest.MonkeyPatch) -> None:
    files = {"/etc/machine-id": "", "/var/lib/dbus/machine-id": "0123456789abcdef" * 2 + "\n"}
    monkeypatch.setattr(hp, "read_text", lambda path: files.get(path))
    assert hp.machine_facts() == hp.machine_id_digest("0123456789abcdef" * 2)
    files.clear()
    assert hp.machine_facts() is None
