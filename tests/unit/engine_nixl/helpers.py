"""Builders shared by the NIXL-side tests: the tiny model's geometry, metrics and log recorders."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from narwhal.core.kv.geometry import Geometry, plan_geometry
from narwhal.core.kv.plan import LaunchPlan
from narwhal.lab.engine.nixl.api import PullOutcome
from tests.unit.kv.helpers import config

TINY_MODEL = "/tmp/vllm-cpu/tiny-llama"


def tiny(**plan: Any) -> Geometry:
    """The real tier's tiny Llama (2 layers, 2 KV heads, head 32, fp32) on the CPU backend."""
    values: dict[str, Any] = {"model": TINY_MODEL, "dtype": "float32",
                              "attention_backend": "CPU_ATTN", **plan}
    return plan_geometry(config("tiny-llama"), LaunchPlan(**values))


@dataclass
class Metrics:
    """A KvMetrics that remembers every call, as the HTTP side's registry would count them."""

    done: list[PullOutcome] = field(default_factory=list)
    failed: int = 0
    notifications_failed: int = 0
    expired: int = 0
    after_expiry: int = 0
    held_blocks: int = 0

    def transfer_done(self, outcome: PullOutcome) -> None:
        self.done.append(outcome)

    def transfer_failed(self) -> None:
        self.failed += 1

    def notification_failed(self) -> None:
        self.notifications_failed += 1

    def lease_expired(self, count: int) -> None:
        self.expired += count

    def notification_after_expiry(self) -> None:
        self.after_expiry += 1

    def kv_held(self, blocks: int, capacity: int) -> None:
        self.held_blocks = blocks


@dataclass
class Switches:
    """Fault switches a test flips while the connector serves."""

    refuse_handshakes: bool = False
    drop_lease_early: bool = False
    recompute_instead_of_pull: bool = False
    stale_peer: bool = False


class Lines(logging.Handler):
    """Every formatted record of one logger, as the HTTP side would print it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")

    def having(self, text: str) -> list[str]:
        return [line for line in self.lines if text in line]


def recorded_logger(name: str) -> tuple[logging.Logger, Lines]:
    log = logging.getLogger(f"nixl-test.{name}")
    log.setLevel(logging.DEBUG)
    log.propagate = False
    for old in list(log.handlers):
        log.removeHandler(old)
    lines = Lines()
    log.addHandler(lines)
    return log, lines
