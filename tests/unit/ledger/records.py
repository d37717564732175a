"""A deployment record for ledger tests, from the shared valid `.env`."""

from __future__ import annotations

from pathlib import Path

from narwhal.deploy.inputs import load_inputs
from narwhal.deploy.ledger import Ledger
from tests.envtext import valid_env


def ledger_for_valid_env(tmp_path: Path) -> Ledger:
    """The ledger of the valid `.env` written (0600) into tmp_path, its secrets known."""
    env = tmp_path / ".env"
    env.write_text(valid_env())
    env.chmod(0o600)
    inputs = load_inputs(env)
    return Ledger(tmp_path / "runs", inputs.deployment, inputs.secrets())
