"""`narwhal lab fault ...`: inject, list and clear faults on a running lab."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from narwhal.lab import lifecycle
from narwhal.lab.faults import Faults


def _faults(args: argparse.Namespace) -> Faults:
    return Faults(Path(args.state) if args.state else lifecycle.default_state_path(args.name))


def _run(args: argparse.Namespace) -> int:
    with lifecycle.locked():
        f = _faults(args)
        kind = args.fault
        result: Any
        if kind == "shape":
            result = f.shape(args.src, args.dst, args.rate)
        elif kind == "loss":
            result = f.loss(args.src, args.dst, args.percent)
        elif kind == "block":
            result = f.block(args.host, args.port, args.mode, args.proto)
        elif kind == "mtu":
            result = f.mtu(args.host, args.mtu)
        elif kind == "hub-cut":
            result = f.hub_cut(args.host)
        elif kind == "rdma":
            result = f.rdma(args.host, args.device)
        elif kind in ("crash", "rekey", "fill", "image", "isolate"):
            result = getattr(f, kind)(args.host)
        elif kind == "boot":
            f.boot(args.host)
            result = {"booted": args.host}
        elif kind == "kill":
            result = {"killed": f.kill(args.host, args.pid, args.signal)}
        elif kind == "tool":
            result = f.tool(args.host, args.tool, args.exit_code, args.stderr)
        elif kind == "missing":
            result = f.missing(args.host, args.tool)
        elif kind == "python":
            result = f.python(args.host, args.version)
        elif kind == "clear":
            result = {"cleared": f.clear(args.id)}
        else:
            result = {"faults": f.state.faults}
    print(json.dumps(result, sort_keys=True))
    return 0


def register(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("fault", help="inject, list or clear faults")
    common(p)
    kinds = p.add_subparsers(dest="fault", metavar="FAULT", required=True)
    for name, helptext in (("shape", "cap directed fabric edge SRC -> DST to RATE (e.g. 200mbit)"),
                           ("loss", "drop PERCENT of packets on fabric edge SRC -> DST")):
        k = kinds.add_parser(name, help=helptext)
        k.add_argument("src")
        k.add_argument("dst")
        k.add_argument("rate" if name == "shape" else "percent", type=str if name == "shape" else int)
    k = kinds.add_parser("block", help="block a port on a host")
    k.add_argument("host")
    k.add_argument("port", type=int)
    k.add_argument("--mode", choices=["reject", "drop"], default="reject")
    k.add_argument("--proto", choices=["tcp", "udp"], default="tcp")
    k = kinds.add_parser("rdma", help="give a host a RoCE device on its fabric")
    k.add_argument("host")
    k.add_argument("--device", default="rxe0")
    k = kinds.add_parser("mtu", help="set the MTU of a host's fabric interface")
    k.add_argument("host")
    k.add_argument("mtu", type=int)
    for name, helptext in (("crash", "power-cut a host"), ("boot", "boot a crashed host"),
                           ("rekey", "give a host a new sshd host key"),
                           ("fill", "fill a host's disk directory"),
                           ("image", "replace a host's engine image by a rebuild under its tag"),
                           ("isolate", "cut a host from every network; its processes run on"),
                           ("hub-cut", "take away a host's route to the lab hub")):
        kinds.add_parser(name, help=helptext).add_argument("host")
    k = kinds.add_parser("kill", help="kill a process on a host by its PID there")
    k.add_argument("host")
    k.add_argument("pid", type=int)
    k.add_argument("--signal", type=int, default=9)
    k = kinds.add_parser("tool", help="make a tool double fail in a stated way")
    k.add_argument("host")
    k.add_argument("tool")
    k.add_argument("--exit-code", type=int, default=1)
    k.add_argument("--stderr", default="")
    k = kinds.add_parser("missing", help="make a real host tool (git, make, ...) absent there")
    k.add_argument("host")
    k.add_argument("tool")
    k = kinds.add_parser("python", help="make the host's python3 report VERSION (e.g. 3.10.12)")
    k.add_argument("host")
    k.add_argument("version")
    k = kinds.add_parser("clear", help="undo every fault (or one, with --id)")
    k.add_argument("--id", type=int)
    kinds.add_parser("list", help="active faults")
    p.set_defaults(handler=_run)

