"""The KV moves over the path Gate D measures: the engine's UCX_TLS and UCX_NET_DEVICES, and an
RDMA container's devices, come from the same transport inputs the fabric gate measures with,
and a launch that would take another path is refused naming the variable or the edge."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.core.errors import Problem
from narwhal.core.transfer_path import TransferPath, derive
from narwhal.deploy.gates.registry import SPECS
from narwhal.deploy.gates.transfer import path_mismatches
from narwhal.node.engine import runplan
from tests.unit.node.test_engine_runplan import _flags, _record

NODES = ("/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0", "/dev/nvidia0")


def _derive(**changes: Any) -> TransferPath | list[Problem]:
    args: dict[str, Any] = {"transport": "ucx_tcp", "fabric_interface": "fab0",
                            "net_devices": None, "hcas": (), "gpu_tls": None,
                            "accelerator": "nvidia", "where": "NARWHAL_NODE_2_"}
    args.update(changes)
    return derive(**args)


def _path(**changes: Any) -> TransferPath:
    got = _derive(**changes)
    assert isinstance(got, TransferPath), got
    return got


def test_tcp_moves_kv_over_the_fabric_interface_iperf3_measures() -> None:
    assert _path().environment() == {"UCX_TLS": "tcp,self,cuda_copy", "UCX_NET_DEVICES": "fab0"}
    cpu = _path(accelerator="none")
    assert cpu.environment()["UCX_TLS"] == "tcp,self" and cpu.device_nodes == ()
    assert _path(accelerator="amd").tls == ("tcp", "self", "rocm_copy")
    assert _path(gpu_tls="cuda").tls == ("tcp", "self", "cuda")


def test_rdma_moves_kv_over_the_hca_port_ib_write_bw_measures() -> None:
    path = _path(transport="ucx_rdma", net_devices="mlx5_0:1", hcas=("mlx5_0",))
    assert path.environment() == {"UCX_TLS": "rc,ud,self,cuda_copy",
                                  "UCX_NET_DEVICES": "mlx5_0:1"}
    on_host = path.on_host(list(NODES))
    assert on_host.device_nodes == ("/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0")
    assert on_host.route() == path.route()  # what Gate D compares: the host's nodes aside
    with pytest.raises(ValueError, match="no /dev/infiniband"):
        path.on_host(["/dev/nvidia0"])
    assert _path().on_host([]) == _path()  # TCP needs no device node


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"transport": "ucx_rdma"}, "NARWHAL_NODE_2_TRANSFER_NET_DEVICES", "is empty"),
    ({"transport": "ucx_rdma", "net_devices": "mlx5_1:1", "hcas": ("mlx5_0",)},
     "NARWHAL_NODE_2_TRANSFER_NET_DEVICES", "mlx5_1"),
])
def test_an_rdma_path_the_host_cannot_take_is_refused_naming_the_variable(
        changes: dict[str, Any], field: str, words: str) -> None:
    got = _derive(**changes)
    assert isinstance(got, list) and got[0].field == field and words in got[0].problem
    assert got[0].fix


def test_the_run_plan_gives_the_engine_its_path_and_an_rdma_container_its_devices() -> None:
    path = _path(transport="ucx_rdma", net_devices="rxe0:1").on_host(list(NODES))
    plan = runplan.build(_record("docker", "nvidia"), "c" * 64, "docker", path)
    argv = plan["argv"]
    assert "UCX_NET_DEVICES=rxe0:1" in _flags(argv, "-e")
    assert "UCX_TLS=rc,ud,self,cuda_copy" in _flags(argv, "-e")
    assert _flags(argv, "--device")[-2:] == list(path.device_nodes)
    assert "IPC_LOCK" in _flags(argv, "--cap-add")
    assert plan["transfer"] == path.model_dump(mode="json")
    native = runplan.build(_record("native", "none"), "c" * 64, "native", _path())
    assert native["environment"]["UCX_NET_DEVICES"] == "fab0"
    assert "--device" not in native["argv"]


def test_a_launch_environment_that_takes_another_path_is_refused_naming_it() -> None:
    record = _record("docker", "nvidia", environment={"UCX_NET_DEVICES": "eth9"})
    with pytest.raises(runplan.PathRefused) as caught:
        runplan.build(record, "c" * 64, "docker", _path())
    message = str(caught.value)
    assert "UCX_NET_DEVICES='eth9'" in message and "NARWHAL_ENGINE_ENV" in message
    same = _record("docker", "nvidia", environment={"UCX_NET_DEVICES": "fab0"})
    assert runplan.build(same, "c" * 64, "docker", _path())["argv"]
    for tls in ("tcp,rc", "rc_x,ud_x", "all", "self,cuda_copy"):  # another network, or none
        with pytest.raises(runplan.PathRefused, match="UCX_TLS"):
            runplan.build(_record("native", "nvidia", environment={"UCX_TLS": tls}), "c" * 64,
                          "native", _path())
    # an operator's own copy transports beside the path's network one are kept and recorded
    extra = runplan.build(_record("native", "nvidia", environment={
        "UCX_TLS": "tcp,self,cuda_copy,cuda_ipc"}), "c" * 64, "native", _path())
    assert extra["environment"]["UCX_TLS"] == "tcp,self,cuda_copy,cuda_ipc"
    assert extra["transfer"]["tls"] == ["tcp", "self", "cuda_copy", "cuda_ipc"]


def test_an_edge_whose_engine_runs_on_another_path_is_named() -> None:
    tcp, rdma = _path(), _path(transport="ucx_rdma", net_devices="rxe0:1")
    started = {"engine-1": tcp.model_dump(mode="json"),
               "engine-2": tcp.on_host(list(NODES)).model_dump(mode="json")}
    edges = [("node-1->node-2", "node-1", "node-2"), ("node-2->node-1", "node-2", "node-1")]
    hosts = {"engine-1": "node-1", "engine-2": "node-2"}
    assert path_mismatches(edges, {"engine-1": tcp, "engine-2": tcp}, started, hosts) == []
    rdma_started = {**started, "engine-2": rdma.on_host(list(NODES)).model_dump(mode="json")}
    assert path_mismatches(edges, {"engine-1": tcp, "engine-2": rdma}, rdma_started,
                           hosts) == []  # the host's device nodes are not the path
    found = path_mismatches(edges, {"engine-1": tcp, "engine-2": rdma}, started, hosts)
    assert [p.field for p in found] == ["node-1->node-2: engine-2", "node-2->node-1: engine-2"]
    assert "UCX_NET_DEVICES=fab0" in found[0].problem and "rxe0:1" in found[0].problem
    assert "narwhal engines" in found[0].fix


def test_the_transport_settings_define_exactly_gates_c_and_d() -> None:
    assert {g for g, spec in SPECS.items() if "transport" in spec.inputs} == {"engines",
                                                                              "fabric"}
