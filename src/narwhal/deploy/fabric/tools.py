"""The two measuring tools behind one shape: iperf3 for TCP transports, perftest's ib_write_bw
for RDMA (`ucx_rdma` on both ends). Each knows its server and client command lines (every
value a separate argv word; deploy/hosts/commandline.py quotes them), the parameters a sample
depends on (part of the link record), and how its client's output reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from narwhal.deploy.fabric import iperf, perftest

RDMA_MESSAGE_BYTES = 1 << 20  # 1 MiB writes: a KV block transfer, not a latency probe
Sample = iperf.IperfSample | perftest.PerftestSample


@dataclass(frozen=True)
class Rdma:
    """An HCA port from TRANSFER_NET_DEVICES (`mlx5_0:1`), and the GID index to use on it."""

    device: str
    port: int
    gid_index: int | None = None  # None: perftest's default (InfiniBand, or no GID table)

    @classmethod
    def parse(cls, text: str | None) -> Rdma | None:
        first = (text or "").split(",")[0].strip()
        if not first:
            return None
        device, _, port = first.partition(":")
        return cls(device, int(port) if port.isdigit() else 1)

    def with_gid(self, rdma_facts: list[dict[str, Any]], address: str) -> Rdma:
        """The RoCE v2 GID of the fabric address on this port, from Gate A's sysfs facts (the
        runbook's by-hand step: read gid_attrs/types and gids, pick the v2 one of the IP)."""
        for dev in rdma_facts:
            if dev.get("device") != self.device:
                continue
            for port in dev.get("ports") or []:
                if port.get("port") != self.port:
                    continue
                for gid in port.get("gids") or []:
                    if gid.get("gid") == f"::ffff:{address}" and gid.get("type") == "RoCE v2":
                        return Rdma(self.device, self.port, int(gid["index"]))
        return self


@dataclass(frozen=True)
class Tool:
    name: str  # iperf3 or ib_write_bw
    seconds: int
    omit_s: int
    parallel: int
    port: int
    rdma: Rdma | None = None  # the consumer's HCA port (ib_write_bw)
    source_rdma: Rdma | None = None  # the producer's

    def parameters(self) -> dict[str, Any]:
        base: dict[str, Any] = {"tool": self.name, "seconds": self.seconds, "port": self.port}
        if self.name == "iperf3":
            return {**base, "omit_s": self.omit_s, "parallel": self.parallel}
        assert self.rdma is not None and self.source_rdma is not None
        return {**base, "message_bytes": RDMA_MESSAGE_BYTES,
                "source_hca": f"{self.source_rdma.device}:{self.source_rdma.port}",
                "source_gid_index": self.source_rdma.gid_index,
                "destination_hca": f"{self.rdma.device}:{self.rdma.port}",
                "destination_gid_index": self.rdma.gid_index}

    def server(self, bind: str) -> list[str]:
        if self.name == "iperf3":
            return ["iperf3", "--server", "--one-off", "--bind", bind, "--port", str(self.port)]
        assert self.rdma is not None
        return ["ib_write_bw", *self._rdma_args(self.rdma), "--bind_source_ip", bind]

    def client(self, bind: str, destination: str) -> list[str]:
        if self.name == "iperf3":
            return ["iperf3", "--client", destination, "--bind", bind, "--port", str(self.port),
                    "--time", str(self.seconds), "--omit", str(self.omit_s), "--parallel",
                    str(self.parallel), "--connect-timeout", "3000", "--json"]
        assert self.source_rdma is not None
        return ["ib_write_bw", *self._rdma_args(self.source_rdma), "--bind_source_ip", bind,
                destination]

    def _rdma_args(self, hca: Rdma) -> list[str]:
        gid = ["-x", str(hca.gid_index)] if hca.gid_index is not None else []
        return ["-d", hca.device, "-i", str(hca.port), *gid, "-p", str(self.port), "-D",
                str(self.seconds), "-s", str(RDMA_MESSAGE_BYTES), "--report_gbits", "-F"]

    def parse(self, stdout: str, stderr: str, exit_status: int) -> Sample | iperf.IperfError:
        try:
            if self.name == "iperf3":
                return iperf.parse(stdout)
            return perftest.parse(stdout, stderr, exit_status)
        except ValueError as exc:
            return iperf.IperfError("other", str(exc))

    @property
    def timeout_s(self) -> float:
        return self.seconds + self.omit_s + 30
