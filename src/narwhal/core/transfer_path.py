"""The KV transfer path: which UCX transports and devices an engine's NIXL agent may use.

Gate D proves one path per host (iperf3 over the fabric interface for `ucx_tcp`,
ib_write_bw on the HCA port for `ucx_rdma`); the engine must then move its KV over that same
path and no other. Left to itself UCX picks any transport and device it finds (UCX_TLS=all),
so an engine on a host with an HCA could move KV over RDMA while the fabric evidence describes
TCP, or over another interface than the one measured. The path is therefore derived once, here,
from the same inputs Gate D measures with, and the run plan (`narwhal-engine prepare`), the
attestation and the link records all carry it.

Every role reads it: the workstation derives it (Gates C and D), narwhal-engine turns it into
the engine's environment and container devices, the sidecar attests it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field

from narwhal.core.document_io import StrictModel
from narwhal.core.errors import Problem

# What each NARWHAL_GPU_TLS value adds to UCX_TLS (UCX's own transport names and aliases).
GPU_TLS: dict[str, tuple[str, ...]] = {"cuda": ("cuda",), "cuda_copy": ("cuda_copy",),
                                       "rocm": ("rocm",)}
# Without NARWHAL_GPU_TLS: the copy transport that moves GPU KV to the network transport.
DEFAULT_GPU_TLS: dict[str, tuple[str, ...]] = {"nvidia": ("cuda_copy",),
                                               "amd": ("rocm_copy",), "none": ()}
NETWORK_TLS: dict[str, tuple[str, ...]] = {"ucx_tcp": ("tcp",), "ucx_rdma": ("rc", "ud")}
RDMA_NODES_PREFIX = "/dev/infiniband/"


class TransferPath(StrictModel):
    """One engine's KV transfer path (`narwhal.transfer-path`, carried inside run plans)."""

    transport: Literal["ucx_tcp", "ucx_rdma"]
    net_devices: tuple[str, ...] = Field(min_length=1)  # UCX_NET_DEVICES: interface or HCA:port
    tls: tuple[str, ...] = Field(min_length=1)  # UCX_TLS
    hcas: tuple[str, ...] = ()  # NARWHAL_TRANSFER_DEVICES: the HCAs the engine may use
    # what a container is given (/dev/infiniband/*): found on the host by `prepare`, since
    # only the host knows its device nodes now
    device_nodes: tuple[str, ...] = ()

    def environment(self) -> dict[str, str]:
        return {"UCX_TLS": ",".join(self.tls), "UCX_NET_DEVICES": ",".join(self.net_devices)}

    def route(self) -> dict[str, object]:
        """What Gate D measures of the path: the transport and its devices (not the host's
        device nodes, nor the copy transports beside the network one)."""
        return self.model_dump(mode="json", exclude={"device_nodes", "tls"})

    def on_host(self, nodes: list[str]) -> TransferPath:
        """The path with the host's RDMA device nodes (none needed for TCP); ValueError when
        an RDMA path finds none."""
        if self.transport != "ucx_rdma":
            return self
        found = tuple(sorted(n for n in nodes if n.startswith(RDMA_NODES_PREFIX)))
        if not found:
            raise ValueError("the transport is ucx_rdma, but this host has no /dev/infiniband "
                             "device node: load the HCA's driver (rdma-core) or set "
                             "NARWHAL_TRANSFER_TRANSPORT=ucx_tcp")
        return self.model_copy(update={"device_nodes": found})


def _net_devices(transport: str, interface: str, net_devices: str | None) -> tuple[str, ...]:
    if transport == "ucx_tcp":
        return (interface,)
    return tuple(d.strip() for d in (net_devices or "").split(",") if d.strip())


def derive(*, transport: str, fabric_interface: str, net_devices: str | None,
           hcas: tuple[str, ...], gpu_tls: str | None, accelerator: str,
           where: str) -> TransferPath | list[Problem]:
    """The path of one engine from its transport inputs, or every problem that keeps it from
    one (each naming `where`'s variable and the fix)."""
    devices = _net_devices(transport, fabric_interface, net_devices)
    problems: list[Problem] = []
    if transport == "ucx_tcp" and net_devices and net_devices.strip() != fabric_interface:
        problems.append(Problem(f"{where}TRANSFER_NET_DEVICES", f"is {net_devices!r}, but "
                                "ucx_tcp moves KV over the fabric interface "
                                f"{fabric_interface} (what Gate D measures)",
                                "unset it, or set NARWHAL_TRANSFER_TRANSPORT=ucx_rdma to name "
                                "HCA ports"))
    if not devices:
        problems.append(Problem(f"{where}TRANSFER_NET_DEVICES", "is empty, but the transport "
                                "is ucx_rdma", "name the HCA port Gate D measures, e.g. "
                                "mlx5_0:1"))
    named = {d.split(":", 1)[0] for d in devices} if transport == "ucx_rdma" else set()
    allowed = {h.split(":", 1)[0] for h in hcas}  # an HCA may be written with its port
    outside = sorted(named - allowed) if hcas else []
    if outside:
        problems.append(Problem(f"{where}TRANSFER_NET_DEVICES", f"names {', '.join(outside)}, "
                                "not among NARWHAL_TRANSFER_DEVICES", "list every HCA the "
                                "engine uses in NARWHAL_TRANSFER_DEVICES, or unset it"))
    if problems:
        return problems
    # NIXL checks UCX_TLS for the GPU memory kind on any host with GPUs, even when the KV is
    # staged in host memory (kv_buffer_device cpu): the copy transport stays in the list
    staging = GPU_TLS.get(gpu_tls or "", DEFAULT_GPU_TLS.get(accelerator, ()))
    tls = (*NETWORK_TLS[transport], "self", *staging)
    return TransferPath(transport=transport,  # type: ignore[arg-type]
                        net_devices=devices, tls=tls, hcas=hcas)


# UCX transport names by the network they move bytes over (aliases and accelerated forms).
RDMA_TLS_PREFIXES = ("rc", "ud", "dc", "ib")


def _network(tl: str) -> str | None:
    name = tl.strip().lower()
    if name == "tcp":
        return "ucx_tcp"
    if name.startswith(RDMA_TLS_PREFIXES):
        return "ucx_rdma"
    return None  # self, sm, cuda_copy, ...: not a network


def conflicts(path: TransferPath, environment: Mapping[str, str]) -> list[str]:
    """The launch environment's UCX variables that would send the KV another way than `path`
    (NARWHAL_ENGINE_ENV may set them): other devices, or a UCX_TLS without the path's network
    transport, with another network's, or `all`. A UCX_TLS that only adds copy or shared
    memory transports beside the path's network one is the operator's to choose."""
    found = []
    devices = environment.get("UCX_NET_DEVICES")
    if devices is not None and devices != ",".join(path.net_devices):
        found.append(f"UCX_NET_DEVICES={devices!r} (the path measured is "
                     f"{','.join(path.net_devices)!r})")
    tls = environment.get("UCX_TLS")
    if tls is not None:
        networks = {_network(t) for t in tls.split(",")} - {None}
        if networks != {path.transport} or "all" in tls.lower().split(","):
            found.append(f"UCX_TLS={tls!r} (the path measured moves KV over "
                         f"{','.join(NETWORK_TLS[path.transport])} only)")
    return found
