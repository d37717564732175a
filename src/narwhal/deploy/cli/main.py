"""`narwhal` argument parsing and dispatch; errors become one line and an exit code."""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Callable, Sequence

from narwhal import __version__
from narwhal.core.cli_common import EXIT_FAILED, not_built
from narwhal.core.errors import InputError, NarwhalError
from narwhal.core.gates import GATES

Handler = Callable[[argparse.Namespace], int]

# Command groups that live in their own modules; each has register(subparsers).
# `lab` is dispatched by module name so product code never imports the lab package.
COMMAND_MODULES: tuple[str, ...] = (
    "narwhal.deploy.cli.inputs_cmd",
    "narwhal.deploy.cli.ledger_cmd",
    "narwhal.deploy.cli.hosts_cmd",
    "narwhal.deploy.cli.kv_cmd",
)
LAB_MODULE = "narwhal.lab.cli"


def _gate_stub(title: str, command: str) -> Handler:
    def run(_args: argparse.Namespace) -> int:
        return not_built(f"narwhal {command}", title)

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="narwhal",
        description="Deploy and run a disaggregated vLLM fleet, one recorded gate at a time.",
    )
    parser.add_argument("--version", action="version", version=f"narwhal {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for gate in GATES:
        p = sub.add_parser(gate.command, help=f"gate {gate.letter}: {gate.title}")
        p.set_defaults(handler=_gate_stub(gate.title, gate.command))
    trial = sub.add_parser("trial", help="gate G: capacity trial through the SSH tunnel")
    trial.set_defaults(handler=_gate_stub("Capacity trial through the SSH tunnel", "trial"))
    deploy = sub.add_parser("deploy", help="run gates A..G in order, skipping what is still valid")
    deploy.set_defaults(handler=_gate_stub("Gates A..G in order", "deploy"))
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(sub)
    lab = sub.add_parser("lab", help="a multi-host rehearsal fleet on this machine", add_help=False)
    lab.add_argument("rest", nargs=argparse.REMAINDER)
    lab.set_defaults(handler=_run_lab)
    return parser


def _run_lab(args: argparse.Namespace) -> int:
    try:
        module = importlib.import_module(LAB_MODULE)
    except ModuleNotFoundError:
        return not_built("narwhal lab", "multi-host rehearsal fleet in network namespaces")
    result: int = module.main(list(args.rest))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except InputError as exc:
        print(f"narwhal: {exc}", file=sys.stderr)
        return exc.exit_code
    except NarwhalError as exc:
        print(f"narwhal: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("narwhal: interrupted", file=sys.stderr)
        return 130
    except Exception:
        traceback.print_exc()
        print("narwhal: this is a bug in Narwhal; please report it with the trace above",
              file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
