"""ib_write_bw double: perftest's report format, with bytes really moved over the fabric by TCP.

Without an RDMA device in the host's inventory it fails exactly as perftest does on a machine
without one. With one, the server listens on the host's fabric address and the client streams
for the requested duration or iteration count, so a shaped fabric edge shows in the number.
"""

from __future__ import annotations

import socket
import sys
import time
from typing import Any

from narwhal.lab.doubles.common import host_data, injected_failure

DEFAULT_PORT = 18515
VERSION = "6.06"  # perftest 4.5's ib_write_bw, as Debian ships it
RULE = "-" * 87
NO_DEVICE = (" Did not detect devices \n If device exists, check if driver is up\n"
             " Unable to find the Infiniband/RoCE device\n")


def _header(dev: str, link: str, mtu: int) -> str:
    return "\n".join([RULE, "                    RDMA_Write BW Test",
                      f" Dual-port       : OFF\t\tDevice         : {dev}",
                      " Number of qps   : 1\t\tTransport type : IB",
                      " Connection type : RC\t\tUsing SRQ      : OFF",
                      " PCIe relax order: ON", " TX depth        : 128", " CQ Moderation   : 1",
                      f" Mtu             : {min(mtu, 4096)}[B]", f" Link type       : {link}",
                      " GID index       : 3", " Max inline data : 0[B]", " rdma_cm QPs\t : OFF",
                      " Data ex. method : Ethernet", RULE, ""])


def _opts(argv: list[str]) -> dict[str, Any]:
    o: dict[str, Any] = {"port": DEFAULT_PORT, "size": 65536, "iters": 5000, "duration": None,
                         "gbits": False, "server": None, "dev": None, "bind": None,
                         "ib_port": 1}
    valued = {"-p": ("port", int), "--port": ("port", int), "-s": ("size", int), "--size": ("size", int),
              "-n": ("iters", int), "--iters": ("iters", int), "-D": ("duration", float),
              "--duration": ("duration", float), "-d": ("dev", str), "--ib-dev": ("dev", str),
              "-i": ("ib_port", int), "--ib-port": ("ib_port", int),
              "--bind_source_ip": ("bind", str)}
    ignored_valued = {"-x", "--gid-index", "-q", "--qp", "-m", "--mtu"}
    ignored_flags = {"-F", "--CPU-freq", "-R", "--rdma_cm"}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in valued:
            key, kind = valued[a]
            o[key] = kind(argv[i + 1])
            i += 1
        elif a == "--report_gbits":
            o["gbits"] = True
        elif a in ignored_flags:
            pass
        elif a in ignored_valued:
            i += 1
        elif not a.startswith("-"):
            o["server"] = a
        i += 1
    return o


def _serve(ip: str, port: int) -> int:
    print("\n************************************\n* Waiting for client to connect... *\n"
          "************************************", flush=True)
    with socket.create_server((ip, port), reuse_port=False) as srv:
        srv.settimeout(60)
        conn, _ = srv.accept()
        with conn:
            while conn.recv(1 << 20):
                pass
    return 0


def _client(o: dict[str, Any], ip: str) -> tuple[int, int, float]:
    chunk = b"\0" * o["size"]
    sent = iters = 0
    with socket.create_connection((o["server"], o["port"]), timeout=10, source_address=(ip, 0)) as s:
        start = time.monotonic()
        while True:
            s.sendall(chunk)
            sent += len(chunk)
            iters += 1
            elapsed = time.monotonic() - start
            if (o["duration"] and elapsed >= o["duration"]) or (not o["duration"] and iters >= o["iters"]):
                break
        s.shutdown(socket.SHUT_WR)
        s.recv(1)
        elapsed = time.monotonic() - start
    return sent, iters, elapsed


def main(host_dir: str, argv: list[str]) -> int:
    failed = injected_failure(host_dir, "ib_write_bw")
    if failed is not None:
        return failed
    if argv[:1] in (["--version"], ["-V"]):
        print(f"Version: {VERSION}")  # perftest's own line; no device is needed for it
        return 0
    data = host_data(host_dir)
    rdma = (data.get("hardware") or {}).get("rdma") or []
    o = _opts(argv)
    dev = next((d for d in rdma if o["dev"] in (None, d["name"])), None)
    if dev is None:
        sys.stderr.write(NO_DEVICE)
        return 1
    sys.stdout.write(_header(dev["name"], dev["link_layer"], data["fabric_mtu"]))
    if o["server"] is None:
        return _serve(o["bind"] or data["fabric_ip"], o["port"])
    try:
        sent, iters, elapsed = _client(o, o["bind"] or data["fabric_ip"])
    except OSError as exc:
        print(f" Couldn't connect to {o['server']}:{o['port']}\nUnable to open file descriptor for socket connection {exc}",
              file=sys.stderr)
        return 1
    rate = sent / elapsed
    unit = "Gb/sec" if o["gbits"] else "MB/sec"
    value = rate * 8 / 1e9 if o["gbits"] else rate / 1048576
    print(f" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]")
    print(f" {o['size']:<10} {iters:<16} {value:.2f}            {value:.2f}\t\t   {iters / elapsed / 1e6:.6f}")
    print(RULE)
    return 0
