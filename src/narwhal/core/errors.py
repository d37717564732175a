"""The one exception tree, drawn once.

    NarwhalError
      InputError            one or more problems in something a user wrote (exit 2)
      HostError             a command or transfer on a host failed (alias, command, exit)
        HostUnreachable     the host could not be contacted within the connect timeout
        HostKeyChanged      the pinned host key differs from what the host presents
        ClientToolMissing   the workstation lacks the program that reaches the host (sshpass)
        TransferMismatch    a file arrived with a different sha256 than was sent
      GateBlocked           a gate cannot pass; recorded in the ledger before state changes
      LedgerError           the deployment record is missing, corrupt or would be overwritten
      ContractError         a versioned document or result line does not match its contract

The CLI maps each to one line and an exit code; anything else is a bug and gets a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass


class NarwhalError(Exception):
    """Base of every error Narwhal raises on purpose."""

    exit_code = 1


@dataclass(frozen=True)
class Problem:
    """One problem in user input: where it is, what is wrong, how to fix it."""

    field: str
    problem: str
    fix: str

    def line(self) -> str:
        return f"{self.field}: {self.problem}; {self.fix}"


class InputError(NarwhalError):
    """Every problem found in one user document, reported together."""

    exit_code = 2

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(f"  - {p.line()}" for p in self.problems)
        super().__init__(f"{source}: {len(self.problems)} problem(s)\n{lines}")


class HostError(NarwhalError):
    """A command on a host failed; carries the host alias, never its address or secrets."""

    def __init__(self, alias: str, message: str, *, command: str = "", exit_status: int = -1):
        self.alias = alias
        self.command = command
        self.exit_status = exit_status
        super().__init__(f"{alias}: {message}")


class HostUnreachable(HostError):
    """The host did not answer within the connect timeout."""


class HostKeyChanged(HostError):
    """The host presented a key that differs from the pinned one."""

    def __init__(self, alias: str, pinned: str, presented: str) -> None:
        self.pinned = pinned
        self.presented = presented
        super().__init__(
            alias,
            "host key changed: pinned "
            f"{pinned}, host now presents {presented}. Verify the new fingerprint out of band "
            "(console or provider), then run `narwhal hosts trust --replace "
            f"{alias}`",
        )


class ClientToolMissing(HostError):
    """The workstation lacks a program needed to reach the host (sshpass for a password login),
    so no host was contacted: the fix is on the workstation, not the host."""

    def __init__(self, alias: str, tool: str, needed_by: str) -> None:
        self.tool = tool
        super().__init__(alias, f"{tool} is not installed on the workstation ({needed_by} "
                         "needs it)", command=tool)


class TransferMismatch(HostError):
    """A copied file's sha256 at the destination differs from the source."""


class GateBlocked(NarwhalError):
    """A gate cannot pass; the ledger records this before any state changes."""

    def __init__(self, gate: str, cause: str, problems: list[Problem] | tuple[Problem, ...] = (),
                 ) -> None:
        self.gate = gate
        self.cause = cause
        self.problems = tuple(problems)  # every problem found, each naming host, field and fix
        super().__init__(f"gate {gate} blocked: {cause}")


class LedgerError(NarwhalError):
    """The deployment record cannot be read or written as asked."""


class ContractError(NarwhalError):
    """A versioned document or result line is not what its contract says."""
