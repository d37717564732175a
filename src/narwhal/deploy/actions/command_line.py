"""What every gate command's argparse handler shares: its parser's common flags, and running
the gate's function (actions/gate_commands.py) with the verdict reported as it ends."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from narwhal.core.cli_common import EXIT_FAILED, EXIT_OK
from narwhal.core.errors import GateBlocked
from narwhal.deploy.actions.context import Context, add_common
from narwhal.deploy.actions.gate_commands import COMMANDS
from narwhal.deploy.actions.output import Progress, report_blocked, report_passed

Handler = Callable[[argparse.Namespace], int]


def add_gate_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
                    help_text: str, handler: Handler) -> argparse.ArgumentParser:
    """A gate command's parser: the common flags and `--json`; the caller adds its own."""
    p = sub.add_parser(name, help=help_text)
    add_common(p)
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(handler=handler)
    return p


def run_gate_command(args: argparse.Namespace, name: str, options: Any) -> int:
    """Run gate `name` with `options`; a blocked verdict is exit 1 with its problems."""
    ctx = Context.load(args)
    command = COMMANDS[name]
    try:
        result = command.run(ctx, options, Progress(args.json))
    except GateBlocked as exc:
        report_blocked(name, args.json, exc, command.blocked_after)
        return EXIT_FAILED
    report_passed(name, args.json, ctx.ledger, command.shown(result),
                  lambda: command.table(result))
    return EXIT_OK
