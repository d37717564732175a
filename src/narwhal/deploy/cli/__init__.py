"""The `narwhal` command: one subcommand per gate plus the ledger, inputs and host commands."""

from narwhal.deploy.cli.main import main

__all__ = ["main"]
