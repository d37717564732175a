"""`narwhal fabric`: Gate D, one directed edge at a time, with progress, a table and `--json`."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from narwhal.core.flag_types import number
from narwhal.deploy.cli.context import Context
from narwhal.deploy.cli.gate_command import (
    Execute,
    add_gate_parser,
    run_gate_command,
)
from narwhal.deploy.cli.gate_output import Progress
from narwhal.deploy.gates import fabric
from narwhal.deploy.hosts.sessions import Sessions


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
    ctx = Context.load(args)
    progress = Progress(args.json)
    options = fabric.FabricOptions(seconds=args.seconds, omit_s=args.omit,
                                   parallel=args.parallel, port=args.port,
                                   resample=tuple(args.resample))

    def prepare(sessions: Sessions) -> tuple[Any, Execute]:
        p = fabric.plan(ctx.inputs, ctx.ledger, options)
        progress.say(f"narwhal fabric: {len(p.edges)} directed edge(s) between "
                     f"{len(p.hosts)} hosts, one at a time")
        return p.document(), lambda attempt: fabric.execute(ctx.inputs, sessions, ctx.ledger,
                                                            attempt, p, progress)

    return run_gate_command(args, ctx, fabric.SPEC, prepare, _table)


def _table(result: dict[str, Any]) -> None:
    table = Table(title="fabric edges")
    for column in ("edge", "required Gbit/s", "measured Gbit/s", "margin", "verdict", "sample"):
        table.add_column(column)
    for e in result["edges"]:
        table.add_row(e["edge"], f"{e['required_gbps']:.4f}", f"{e['measured_gbps']:.3f}",
                      f"{e['margin']:.1f}x", e["verdict"],
                      f"reused from {e['measured_in']}" if e["reused"] else "measured")
    Console().print(table)
