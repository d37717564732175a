"""QuorumLease's majority arithmetic against real sidecar lease routes: the sidecar's own HTTP
server and keeper (node/attest) run in threads on loopback, so every call crosses a socket and
the real authentication, body checks and grant rules."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import cast

import pytest

from narwhal.core.secret import Secret
from narwhal.node.attest.document import Attested
from narwhal.node.attest.lease import STATE_FILE, Keeper
from narwhal.node.attest.lease_desk import LeaseDesk
from narwhal.node.attest.server import serve
from narwhal.serve.router.control.lease import Claimant, LeaseHeld, LeaseLost
from narwhal.serve.router.control.lease_calls import call
from narwhal.serve.router.control.quorum_lease import DRIFT, LeaseUnavailable, QuorumLease

KEY = Secret("k" * 32)
TTL = 1.0
A = Claimant("router-a", "http://10.0.0.1:8000", 101, "host-a")
B = Claimant("router-b", "http://10.0.0.2:8000", 202, "host-b")


class Sidecar:
    """One sidecar's lease routes: the real server and keeper, in a thread on loopback."""

    def __init__(self, run_dir: Path, deployment: str = "fleet-1") -> None:
        run_dir.mkdir()
        self.desk = LeaseDesk(Keeper(run_dir / STATE_FILE), KEY, deployment)
        # The attestation route is not called here: the lease routes never read it.
        self.server: ThreadingHTTPServer = serve(cast(Attested, None), "127.0.0.1", 0, self.desk)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/lease"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,),
                                       daemon=True)
        self.thread.start()
        self.up = True

    def stop(self) -> None:
        if self.up:
            self.server.shutdown()
            self.server.server_close()
            self.up = False

    def holder_id(self) -> str | None:
        live = self.desk.keeper.state()[0]
        return live.holder.holder_id if live is not None else None


@pytest.fixture
def sidecars(tmp_path: Path) -> Iterator[list[Sidecar]]:
    made = [Sidecar(tmp_path / f"s{i}") for i in range(3)]
    try:
        yield made
    finally:
        for s in made:
            s.stop()


def _lease(sidecars: list[Sidecar], key: Secret = KEY, deployment: str = "fleet-1") -> QuorumLease:
    return QuorumLease([s.url for s in sidecars], key, deployment, TTL)


def test_all_three_grant_and_the_routers_validity_ends_before_any_sidecars(
        sidecars: list[Sidecar]) -> None:
    before = time.monotonic()
    grant = _lease(sidecars).acquire(A)
    after = time.monotonic()
    # acquire returns once a majority granted; the third grant may still be in flight
    # (under load it landed after the router's round ended): wait for it, bounded
    settle = after + 2.0
    while [s.holder_id() for s in sidecars] != ["router-a"] * 3 and time.monotonic() < settle:
        time.sleep(0.01)
    assert grant.epoch == 1 and [s.holder_id() for s in sidecars] == ["router-a"] * 3
    # taken from the clock between the read round and the acquire round, less the drift
    assert before + TTL * (1 - DRIFT) - 0.1 < grant.valid_until <= after + TTL * (1 - DRIFT)
    for s in sidecars:
        live = s.desk.keeper.state()[0]
        assert live is not None and live.expires - time.monotonic() > grant.valid_until - time.monotonic()


def test_two_of_three_sidecars_are_a_majority_for_acquire_and_renew(
        sidecars: list[Sidecar]) -> None:
    sidecars[2].stop()
    lease = _lease(sidecars)
    grant = lease.acquire(A)
    renewed = lease.renew(grant)
    assert renewed.epoch == grant.epoch and renewed.valid_until > grant.valid_until
    assert lease.holder() is not None and lease.holder().url == A.url  # type: ignore[union-attr]


def test_one_of_three_is_not_a_majority_and_says_so_without_taking_anything(
        sidecars: list[Sidecar]) -> None:
    sidecars[1].stop()
    sidecars[2].stop()
    with pytest.raises(LeaseUnavailable, match="1 of 3 sidecars answered, 2 needed") as caught:
        _lease(sidecars).acquire(A)
    assert isinstance(caught.value, OSError)  # leadership retries OSError as transient
    assert sidecars[1].url in str(caught.value)
    assert sidecars[0].holder_id() is None


def test_a_second_router_is_refused_with_the_holder_named(sidecars: list[Sidecar]) -> None:
    _lease(sidecars).acquire(A)
    with pytest.raises(LeaseHeld) as caught:
        _lease(sidecars).acquire(B)
    record = caught.value.record
    assert (record.url, record.pid, record.host, record.epoch) == (A.url, 101, "host-a", 1)
    assert "router http://10.0.0.1:8000 (pid 101 on host host-a, epoch 1)" in str(caught.value)
    assert [s.holder_id() for s in sidecars] == ["router-a"] * 3


def test_a_partial_acquire_is_released_and_the_refusing_holder_named(
        sidecars: list[Sidecar]) -> None:
    QuorumLease([sidecars[0].url], KEY, "fleet-1", TTL).acquire(B)  # B holds one sidecar
    sidecars[1].stop()
    with pytest.raises(LeaseHeld) as caught:
        _lease(sidecars).acquire(A)  # sidecar 2 grants, sidecar 0 refuses, 1 is down
    assert caught.value.record.url == B.url
    assert sidecars[2].holder_id() is None  # the partial grant did not stay behind
    assert sidecars[0].holder_id() == "router-b"


def test_a_renewal_refused_because_another_holder_took_over_is_lost(
        sidecars: list[Sidecar]) -> None:
    lease = QuorumLease([s.url for s in sidecars], KEY, "fleet-1", 0.2, timeout_s=1.0)
    grant = lease.acquire(A)
    time.sleep(0.3)  # A is paused past its ttl; B takes the lease
    assert QuorumLease([s.url for s in sidecars], KEY, "fleet-1", 5.0).acquire(B).epoch == 2
    # A's own clock says it is late anyway; pretend it is not, to see the sidecars fence it
    forged = dataclasses.replace(grant, valid_until=time.monotonic() + 10)
    with pytest.raises(LeaseLost, match=r"epoch 1 is fenced.*http://10.0.0.2:8000"):
        lease.renew(forged)
    with pytest.raises(LeaseLost, match="expired before it was renewed"):
        lease.renew(grant)


def test_an_expired_grant_is_not_renewed_even_when_nobody_else_holds_it(
        sidecars: list[Sidecar]) -> None:
    lease = QuorumLease([s.url for s in sidecars], KEY, "fleet-1", 0.2, timeout_s=1.0)
    grant = lease.acquire(A)
    time.sleep(0.3)
    forged = dataclasses.replace(grant, valid_until=time.monotonic() + 10)
    with pytest.raises(LeaseLost, match="a majority of sidecars refused to renew epoch 1"):
        lease.renew(forged)
    assert lease.acquire(A).epoch == 2  # the way back is a new epoch


def test_a_renewal_without_a_majority_answering_is_transient_not_lost(
        sidecars: list[Sidecar]) -> None:
    lease = QuorumLease([s.url for s in sidecars], KEY, "fleet-1", 5.0)
    grant = lease.acquire(A)
    sidecars[0].stop()
    sidecars[1].stop()
    with pytest.raises(LeaseUnavailable, match="renew epoch 1"):
        lease.renew(grant)


def test_release_frees_the_lease_for_the_next_router_at_a_higher_epoch(
        sidecars: list[Sidecar]) -> None:
    lease = _lease(sidecars)
    lease.release(lease.acquire(A))
    assert lease.holder() is None
    assert _lease(sidecars).acquire(B).epoch == 2


def test_a_sidecar_ahead_of_the_others_makes_the_next_epoch_higher_still(
        sidecars: list[Sidecar]) -> None:
    one = QuorumLease([sidecars[2].url], KEY, "fleet-1", TTL)
    for _ in range(4):
        one.release(one.acquire(B))  # sidecar 2 has granted epochs 1..4
    assert _lease(sidecars).acquire(A).epoch == 5


def test_a_wrong_key_names_the_key_file_and_changes_nothing(sidecars: list[Sidecar]) -> None:
    with pytest.raises(LeaseUnavailable, match="refused the router's controller key"):
        _lease(sidecars, key=Secret("w" * 32)).acquire(A)
    assert [s.holder_id() for s in sidecars] == [None] * 3


def test_sidecars_of_another_deployment_refuse(sidecars: list[Sidecar]) -> None:
    with pytest.raises(LeaseUnavailable, match="deployment 'fleet-1', not 'fleet-2'"):
        _lease(sidecars, deployment="fleet-2").acquire(A)
    assert [s.holder_id() for s in sidecars] == [None] * 3


def test_holder_is_what_a_majority_agrees_on(sidecars: list[Sidecar]) -> None:
    QuorumLease([sidecars[0].url], KEY, "fleet-1", TTL).acquire(B)  # a minority
    assert _lease(sidecars).holder() is None


def test_the_key_is_never_in_an_answer_or_error(sidecars: list[Sidecar]) -> None:
    secret = KEY.reveal()
    answers = [call(s.url, None, None, KEY, 1.0) for s in sidecars]
    assert all(a.reply is not None and secret not in a.reply.model_dump_json() for a in answers)
    sidecars[0].stop()
    sidecars[1].stop()
    with pytest.raises(LeaseUnavailable) as caught:
        _lease(sidecars).acquire(A)
    assert secret not in str(caught.value) and secret not in repr(_lease(sidecars).key)
