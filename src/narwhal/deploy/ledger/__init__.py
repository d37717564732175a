"""The deployment record: every gate attempt, command, owned item and artifact, in files."""

from narwhal.deploy.ledger.attempt import Attempt
from narwhal.deploy.ledger.store import Ledger

__all__ = ["Attempt", "Ledger"]
