"""`narwhal` argument parsing and dispatch; errors become one line and an exit code."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence

from narwhal import __version__
from narwhal.commands import GROUPS, CommandGroup, load
from narwhal.core.cli_common import EXIT_FAILED, not_built
from narwhal.core.errors import InputError, NarwhalError
from narwhal.deploy.cli import (
    attest_cmd,
    deploy_cmd,
    discover_cmd,
    engines_cmd,
    fabric_cmd,
    hosts_cmd,
    inputs_cmd,
    install_cmd,
    kv_cmd,
    ledger_cmd,
    preflight_cmd,
    serve_cmd,
    shell_cmd,
    trial_cmd,
)

Handler = Callable[[argparse.Namespace], int]

# Command groups that live in their own modules; each has register(subparsers). They are
# imported by name here so the architecture test can check their direction.
COMMAND_MODULES = (inputs_cmd, ledger_cmd, hosts_cmd, kv_cmd, discover_cmd, install_cmd,
                   shell_cmd, engines_cmd, fabric_cmd, attest_cmd, preflight_cmd,
                   serve_cmd, trial_cmd, deploy_cmd)
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="narwhal",
        description="Deploy and run a disaggregated vLLM fleet, one recorded gate at a time.",
    )
    parser.add_argument("--version", action="version", version=f"narwhal {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in COMMAND_MODULES:
        module.register(sub)
    # Groups declared at the distribution root (narwhal/commands.py), such as `lab`: their
    # arguments pass through untouched, their module loads only when the command runs.
    for group in GROUPS:
        p = sub.add_parser(group.name, help=group.help, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(handler=_pass_through(group))
    return parser


def _pass_through(group: CommandGroup) -> Handler:
    def run(args: argparse.Namespace) -> int:
        group_main = load(group)
        if group_main is None:
            return not_built(f"narwhal {group.name}", group.title)
        return group_main(list(args.rest))

    return run


def main(argv: Sequence[str] | None = None) -> int:
    return run_handler(build_parser().parse_args(argv))


def run_handler(args: argparse.Namespace) -> int:
    """Run a parsed command; every error becomes one line and an exit code."""
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
