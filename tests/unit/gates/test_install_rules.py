"""Gate B's resume rule, as data: a rerun after any cut picks up where the host is, a repeated
install changes nothing and says "verified", and nothing an operator put at a target is ever
overwritten."""

from __future__ import annotations

import pytest

from narwhal.deploy.gates.install_rules import (
    checkout_refusal,
    file_action,
    install_outcome,
    marker_stale,
    pip_needed,
)

REV = "a" * 40


@pytest.mark.parametrize(("present", "want", "action"), [
    (None, "d1", "send"),  # never sent, or cut before it was linked into place
    ("d1", "d1", "keep"),  # sent by an earlier (cut or repeated) install
    ("d2", "d1", "refuse"),  # someone else's file: left as it is, named
])
def test_a_file_is_sent_kept_or_refused_by_what_is_at_its_target(
        present: str | None, want: str, action: str) -> None:
    assert file_action(present, want) == action


@pytest.mark.parametrize(("head", "changed", "refused"), [
    (REV, "0", None),
    ("b" * 40, "0", f"is at {'b' * 40} with 0 changed path(s), not a clean {REV}"),
    (REV, "2", f"is at {REV} with 2 changed path(s), not a clean {REV}"),
])
def test_only_a_clean_checkout_at_the_revision_is_used(
        head: str, changed: str, refused: str | None) -> None:
    assert checkout_refusal(head, changed, REV) == refused


@pytest.mark.parametrize(("stamp", "requirements", "runs"), [
    ("r1", "r1", False),  # the venv is complete for these requirements
    ("", "r1", True),  # pip was cut (no stamp) or never ran
    ("r0", "r1", True),  # an earlier run's requirements
    ("r1", None, True),
])
def test_pip_runs_unless_the_venv_stamp_names_these_requirements(
        stamp: str, requirements: str | None, runs: bool) -> None:
    assert pip_needed(stamp, requirements) is runs


@pytest.mark.parametrize(("read_ok", "text", "stale"), [
    (True, f"{REV}\n", False), (True, "b" * 40, True), (False, "", True), (False, REV, True)])
def test_a_marker_is_written_only_when_it_does_not_already_say_so(
        read_ok: bool, text: str, stale: bool) -> None:
    assert marker_stale(read_ok, text, REV) is stale


@pytest.mark.parametrize(("was_installed", "pip_ran", "sent", "said"), [
    (True, False, 0, ("verified", "verified")),  # a repeated install: nothing done
    (True, False, 3, ("verified", "installed")),  # files were missing: the record says so
    (True, True, 0, ("installed", "installed")),
    (False, False, 0, ("installed", "installed")),  # cut before the marker was written
])
def test_verified_only_when_nothing_had_to_be_done(
        was_installed: bool, pip_ran: bool, sent: int, said: tuple[str, str]) -> None:
    assert install_outcome(was_installed, pip_ran, sent) == said
