"""The sidecar's grant keeper on a fake clock: one live holder, rising epochs, no renewal after
expiry, and a persisted epoch (and grant) that a restarted sidecar honours."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest

from narwhal.node.attest.lease import STATE_FILE, Holder, Keeper, Refused


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


A = Holder("router-a", "http://10.0.0.1:8000", 11, "host-a")
B = Holder("router-b", "http://10.0.0.2:8000", 22, "host-b")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def keeper(tmp_path: Path, clock: Clock) -> Keeper:
    return Keeper(tmp_path / STATE_FILE, clock)


def _refusal(call: object) -> Refused:
    assert callable(call)
    with pytest.raises(Refused) as caught:
        call()
    return caught.value


def test_a_second_holder_is_refused_while_the_first_grant_is_live_and_named(
        keeper: Keeper, clock: Clock) -> None:
    keeper.acquire(A, 1, 2.0)
    clock.now += 1.9
    refused = _refusal(lambda: keeper.acquire(B, 2, 2.0))
    assert refused.reason == "held" and refused.holder is not None
    assert refused.holder.holder.url == A.url and refused.holder.epoch == 1
    view = refused.holder.view(clock.now)
    assert view["pid"] == 11 and view["host"] == "host-a" and view["seconds_left"] == 0.1
    clock.now += 0.2  # A's grant lapses: B may now take a higher epoch
    assert keeper.acquire(B, 2, 2.0).holder == B


def test_an_epoch_must_rise_above_every_epoch_granted(keeper: Keeper, clock: Clock) -> None:
    keeper.acquire(A, 5, 1.0)
    keeper.release(A.holder_id, 5)
    for epoch in (1, 5):
        assert _refusal(lambda e=epoch: keeper.acquire(B, e, 1.0)).reason == "stale_epoch"
    assert keeper.acquire(B, 6, 1.0).epoch == 6
    assert keeper.state()[1] == 6


def test_the_same_holder_may_reacquire_at_a_higher_epoch_which_fences_its_old_one(
        keeper: Keeper) -> None:
    keeper.acquire(A, 1, 1.0)
    assert keeper.acquire(A, 2, 1.0).epoch == 2
    assert _refusal(lambda: keeper.renew(A.holder_id, 1, 1.0)).reason == "superseded"
    assert keeper.renew(A.holder_id, 2, 1.0).epoch == 2


def test_renewal_extends_from_now_and_an_expired_grant_is_never_renewed(
        keeper: Keeper, clock: Clock) -> None:
    keeper.acquire(A, 1, 1.0)
    clock.now += 0.9
    assert keeper.renew(A.holder_id, 1, 1.0).expires == pytest.approx(clock.now + 1.0)
    clock.now += 1.0  # exactly at expiry: no longer live
    refused = _refusal(lambda: keeper.renew(A.holder_id, 1, 1.0))
    assert refused.reason == "expired" and "acquire a new epoch" in str(refused)
    assert keeper.state()[0] is None
    assert keeper.acquire(A, 2, 1.0).epoch == 2  # the way back is a new epoch


def test_another_holders_renewal_is_refused_naming_the_holder(keeper: Keeper) -> None:
    keeper.acquire(A, 1, 1.0)
    refused = _refusal(lambda: keeper.renew(B.holder_id, 1, 1.0))
    assert refused.reason == "held" and refused.holder is not None
    assert refused.holder.holder == A
    assert _refusal(lambda: Keeper.renew(keeper, "nobody", 9, 1.0)).reason == "held"


def test_a_renewal_with_no_grant_at_all_is_refused(keeper: Keeper) -> None:
    assert _refusal(lambda: keeper.renew(A.holder_id, 1, 1.0)).reason == "no_grant"


def test_release_frees_the_lease_at_once_but_keeps_the_epoch(keeper: Keeper) -> None:
    keeper.acquire(A, 3, 30.0)
    assert not keeper.release(B.holder_id, 3)  # not B's to release
    assert not keeper.release(A.holder_id, 2)  # not that epoch
    assert keeper.state()[0] is not None
    assert keeper.release(A.holder_id, 3)
    assert keeper.state()[0] is None and keeper.state()[1] == 3
    assert keeper.acquire(B, 4, 1.0).holder == B


@pytest.mark.parametrize("ttl", [0.0, 0.19, 60.01, -1.0, float("nan"), float("inf")])
def test_a_ttl_outside_the_bounds_is_refused(keeper: Keeper, ttl: float) -> None:
    with pytest.raises(ValueError, match=r"outside 0\.2\.\.60"):
        keeper.acquire(A, 1, ttl)
    keeper.acquire(A, 1, 1.0)
    with pytest.raises(ValueError, match="outside"):
        keeper.renew(A.holder_id, 1, ttl)


def test_a_restarted_sidecar_never_grants_an_old_epoch_and_honours_its_live_grant(
        tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / STATE_FILE
    Keeper(path, clock).acquire(A, 7, 2.0)
    assert path.stat().st_mode & 0o777 == 0o600
    clock.now = 5.0  # a new boot: the monotonic clock started again
    again = Keeper(path, clock)
    live, highest, _ = again.state()
    assert highest == 7 and live is not None and live.holder == A  # for one full ttl
    assert _refusal(lambda: again.acquire(B, 8, 2.0)).reason == "held"
    assert again.renew(A.holder_id, 7, 2.0).epoch == 7  # its holder keeps it
    clock.now += 2.0
    assert _refusal(lambda: again.acquire(B, 7, 2.0)).reason == "stale_epoch"
    assert again.acquire(B, 8, 2.0).epoch == 8


def test_a_restart_after_a_release_frees_the_lease_but_keeps_the_epoch(
        tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / STATE_FILE
    first = Keeper(path, clock)
    first.acquire(A, 2, 5.0)
    first.release(A.holder_id, 2)
    again = Keeper(path, clock)
    assert again.state()[:2] == (None, 2)


def test_a_longer_ttl_on_renewal_is_what_a_restart_honours(tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / STATE_FILE
    first = Keeper(path, clock)
    first.acquire(A, 1, 1.0)
    first.renew(A.holder_id, 1, 10.0)
    assert json.loads(path.read_text())["grant"]["ttl_s"] == 10.0


@pytest.mark.parametrize("text", ["{not json", "[]", '{"schema": "narwhal.sidecar-lease-state"}',
                                  '{"schema": "narwhal.sidecar-lease-state", "schema_version": 1,'
                                  ' "highest_epoch": "9", "grant": null}'])
def test_an_unreadable_state_file_stops_the_sidecar_naming_it(
        tmp_path: Path, clock: Clock, text: str) -> None:
    path = tmp_path / STATE_FILE
    path.write_text(text)
    with pytest.raises(ValueError, match=f"{STATE_FILE}.*will not grant epochs"):
        Keeper(path, clock)


def test_concurrent_acquirers_get_exactly_one_grant(keeper: Keeper) -> None:
    winners: list[str] = []
    start = threading.Barrier(16)

    def bid(n: int) -> None:
        start.wait()
        try:
            keeper.acquire(Holder(f"r{n}", "http://x:1", n, "h"), 1, 5.0)
            winners.append(f"r{n}")
        except Refused:
            pass

    threads = [threading.Thread(target=bid, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1


def test_a_grant_that_cannot_be_recorded_is_not_given(tmp_path: Path, clock: Clock) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    keeper = Keeper(folder / STATE_FILE, clock)
    keeper.acquire(A, 1, 1.0)
    keeper.release(A.holder_id, 1)
    shutil.rmtree(folder)
    folder.write_text("not a folder")  # the state file can no longer be written
    with pytest.raises(OSError):
        keeper.acquire(B, 2, 1.0)
    assert keeper.state()[:2] == (None, 1)  # neither the grant nor its epoch was taken
    folder.unlink()
    assert keeper.acquire(B, 2, 1.0).epoch == 2
