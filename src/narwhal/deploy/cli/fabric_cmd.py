"""`narwhal fabric`: Gate D, one directed edge at a time, with progress, a table and `--json`."""

from __future__ import annotations

import argparse

from narwhal.core.flag_types import number
from narwhal.deploy.actions.command_line import add_gate_parser, run_gate_command
from narwhal.deploy.gates import fabric


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = fabric.FabricOptions()
    p = add_gate_parser(sub, "fabric", "gate D: prove every directed fabric edge against the "
                       "budget of the live cache, one edge at a time", run)
    p.add_argument("--seconds", type=number(int, 1, 600), default=d.seconds,
                   help=f"iperf3 test time per edge (default {d.seconds})")
    p.add_argument("--omit", type=number(int, 0, 60), default=d.omit_s,
                   help=f"seconds left out at the start of each test (default {d.omit_s})")
    p.add_argument("--parallel", type=number(int, 1, 128), default=d.parallel,
                   help=f"client streams per test (default {d.parallel})")
    p.add_argument("--port", type=number(int, 1, 65535), default=d.port,
                   help=f"the consumer's test server port (default {d.port})")
    p.add_argument("--resample", action="append", default=[], metavar="SRC->DST",
                   help="measure this edge again although its last sample still holds "
                        "(repeatable; a failed edge is always measured again)")


def run(args: argparse.Namespace) -> int:
    return run_gate_command(args, "fabric", fabric.FabricOptions(
        seconds=args.seconds, omit_s=args.omit, parallel=args.parallel, port=args.port,
        resample=tuple(args.resample)))
