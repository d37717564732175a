"""What most commands start from: the `.env`, the ledger and the host sessions."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from narwhal.deploy.gates.registry import env_fingerprints
from narwhal.deploy.gates.spec import GateSpec
from narwhal.deploy.hosts.sessions import Sessions
from narwhal.deploy.inputs import Inputs, load_inputs
from narwhal.deploy.ledger import Ledger


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", type=Path, default=Path(".env"),
                        help="the workstation .env (default: ./.env)")
    parser.add_argument("--runs", type=Path, default=Path("runs"),
                        help="where deployment records live (default: ./runs)")
    parser.add_argument("--ssh-config", default=None,
                        help="OpenSSH client config to use (default: the user's own)")


@dataclass
class Context:
    inputs: Inputs
    ledger: Ledger
    runs: Path
    ssh_config: str | None

    @classmethod
    def load(cls, args: argparse.Namespace) -> Context:
        inputs = load_inputs(args.env)
        ledger = Ledger(args.runs, inputs.deployment, inputs.secrets(), inputs.masked_env)
        return cls(inputs, ledger, args.runs, args.ssh_config)

    _sessions: Sessions | None = field(default=None, init=False, repr=False)

    def sessions(self) -> Sessions:
        """The run's sessions: every gate of one `narwhal` run shares them, so each physical
        host keeps one ControlMaster from the first gate that reaches it until `close`."""
        if self._sessions is None:
            self._sessions = Sessions(self.inputs, self.runs, self.ssh_config)
        return self._sessions

    def close(self) -> None:
        """End the run's sessions (their masters); a later `sessions()` opens new ones."""
        if self._sessions is not None:
            self._sessions.close()
            self._sessions = None

    def fingerprints(self, specs: Mapping[str, GateSpec] | None = None
                     ) -> dict[str, dict[str, str]]:
        """Gate -> the digest of each `.env` input it declares (`specs`: the runbook's)."""
        return env_fingerprints(self.inputs, specs)
