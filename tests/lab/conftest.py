"""Lab fixtures: one session lab of the default spec, and fault fixtures that always undo."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.lab.installing import installer  # noqa: F401 - a session fixture for every module
from tests.lab.operator import lab_unavailable

from narwhal.lab import lifecycle, spec
from narwhal.lab.faults import Faults
from narwhal.lab.plan import LabPlan


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = lab_unavailable()
    for item in items:
        if "needs_lab" in item.fixturenames or item.get_closest_marker("lab"):
            item.add_marker(pytest.mark.lab)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def lab() -> Iterator[LabPlan]:
    """The default lab, up for the whole session; a crashed earlier run is cleaned first."""
    lab_spec = spec.load(None)
    lifecycle.down(lab_spec.name)
    plan = lifecycle.up(lab_spec)
    try:
        yield plan
    finally:
        lifecycle.down(lab_spec.name)


@pytest.fixture
def needs_lab(lab: LabPlan) -> LabPlan:
    return lab


@pytest.fixture
def faults(needs_lab: LabPlan) -> Iterator[Faults]:
    """Inject faults in a test; every one is undone afterwards, even if the test fails."""
    f = Faults(needs_lab.state_file)
    try:
        yield f
    finally:
        with lifecycle.locked():
            Faults(needs_lab.state_file).clear()


@pytest.fixture
def state_file(needs_lab: LabPlan) -> Path:
    return needs_lab.state_file
