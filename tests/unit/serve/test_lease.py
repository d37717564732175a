"""The file-backed controller lease: one holder at a time, a rising epoch, takeover after expiry."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from narwhal.serve.router.control.lease import Claimant, FileLease, Grant, LeaseHeld, LeaseLost


def _who(n: int) -> Claimant:
    return Claimant(holder_id=f"router-{n}", url=f"http://127.0.0.1:{9000 + n}", pid=4000 + n,
                    host=f"host{n}")


def test_a_free_lease_is_granted_at_epoch_1_and_names_its_holder(tmp_path: Path) -> None:
    lease = FileLease(tmp_path / "fleet.lease", ttl_s=5)
    assert lease.holder() is None
    grant = lease.acquire(_who(1))
    assert grant.epoch == 1
    holder = lease.holder()
    assert holder is not None and (holder.url, holder.pid, holder.host) == (
        "http://127.0.0.1:9001", 4001, "host1")
    doc = json.loads((tmp_path / "fleet.lease").read_text())
    assert doc["schema"] == "narwhal.lease" and doc["epoch"] == 1 and doc["expires_at"] > time.time()


def test_a_second_claimant_is_refused_with_the_holders_url_pid_host_and_expiry(tmp_path: Path) -> None:
    lease = FileLease(tmp_path / "fleet.lease", ttl_s=5)
    lease.acquire(_who(1))
    with pytest.raises(LeaseHeld) as info:
        lease.acquire(_who(2))
    text = str(info.value)
    assert "http://127.0.0.1:9001" in text and "pid 4001" in text and "host1" in text
    assert "until" in text and "s from now" in text
    assert info.value.record.epoch == 1


def test_an_expired_lease_is_taken_over_and_the_old_holder_is_fenced(tmp_path: Path) -> None:
    lease = FileLease(tmp_path / "fleet.lease", ttl_s=0.2)
    old = lease.acquire(_who(1))
    time.sleep(0.3)  # the holder "crashed": it never renewed
    new = lease.acquire(_who(2))
    assert new.epoch == old.epoch + 1
    with pytest.raises(LeaseLost, match="fenced"):
        lease.renew(old)
    lease.release(old)  # releasing a lease that moved on must not free the new holder's
    assert lease.holder() is not None and lease.holder().holder_id == "router-2"  # type: ignore[union-attr]


def test_renewal_extends_the_lease_and_keeps_the_epoch(tmp_path: Path) -> None:
    lease = FileLease(tmp_path / "fleet.lease", ttl_s=0.4)
    grant = lease.acquire(_who(1))
    for _ in range(4):
        time.sleep(0.15)
        grant = lease.renew(grant)
    assert grant.epoch == 1
    with pytest.raises(LeaseHeld):
        lease.acquire(_who(2))  # 0.6 s after acquisition, still held thanks to renewals


def test_a_renewal_after_the_holders_own_deadline_is_refused(tmp_path: Path) -> None:
    lease = FileLease(tmp_path / "fleet.lease", ttl_s=5)
    grant = lease.acquire(_who(1))
    late = Grant(grant.epoch, time.monotonic() - 0.01, grant.record)
    with pytest.raises(LeaseLost, match="expired"):
        lease.renew(late)


def test_the_epoch_rises_on_every_acquisition_including_after_release(tmp_path: Path) -> None:
    lease = FileLease(tmp_path / "fleet.lease", ttl_s=5)
    epochs = []
    for n in range(6):
        grant = lease.acquire(_who(n // 3))  # the same claimant again also gets a new epoch
        epochs.append(grant.epoch)
        if n % 3 == 2:
            lease.release(grant)
            assert lease.holder() is None
    assert epochs == sorted(set(epochs)) and epochs[0] == 1 and len(epochs) == 6


def test_racing_claimants_get_exactly_one_grant(tmp_path: Path) -> None:
    lease_path = tmp_path / "fleet.lease"
    wins: list[int] = []
    refused: list[int] = []
    start = threading.Barrier(8)

    def claim(n: int) -> None:
        start.wait()
        try:
            FileLease(lease_path, ttl_s=5).acquire(_who(n))
            wins.append(n)
        except LeaseHeld:
            refused.append(n)

    threads = [threading.Thread(target=claim, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(wins) == 1 and len(refused) == 7


@pytest.mark.parametrize("content", ["{not json", '{"schema":"other","schema_version":1}',
                                     '{"schema":"narwhal.lease","schema_version":1}'])
def test_a_damaged_lease_file_is_an_error_naming_the_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "fleet.lease"
    path.write_text(content)
    with pytest.raises(OSError, match=str(path)):
        FileLease(path, ttl_s=5).acquire(_who(1))


def test_a_non_positive_ttl_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        FileLease(tmp_path / "x.lease", ttl_s=0)


def test_a_fenced_reason_names_the_new_holder_once() -> None:
    """The renewal names the holder; the failed re-acquire found the same one: said once."""
    import time

    from narwhal.serve.router.control.leadership import fence_reason
    from narwhal.serve.router.control.lease import LeaseHeld, LeaseRecord

    holder = LeaseRecord("h2", "http://10.0.0.2:8000", 42, "r2", 7, time.time(),
                         time.time() + 5)
    lost = f"the lease moved on (epoch 6 is fenced): {holder.describe(time.time())}"
    reason = fence_reason(lost, LeaseHeld(holder))
    assert reason == lost and reason.count("holds the lease") == 1
    other = LeaseRecord("h3", "http://10.0.0.3:8000", 43, "r3", 8, time.time(), time.time() + 5)
    both = fence_reason(lost, LeaseHeld(other))
    assert "10.0.0.2" in both and "10.0.0.3" in both
    assert fence_reason("the lease of epoch 6 expired before it was renewed",
                        OSError("disk gone")).endswith("; disk gone")
