"""Under concurrent load every accepted request leaves exactly one journal row, none dropped."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from tests.component.serve.conftest import Spawner
from tests.component.serve.harness import journal_rows, load


def _run(spawn: Spawner, concurrency: int, seconds: float) -> None:
    p = spawn.engine("p0")
    d = spawn.engine("d0")
    r = spawn.router([("p0", p.url, "prefill"), ("d0", d.url, "decode")])
    sent, ok = asyncio.run(load(r.port, concurrency, seconds, "load"))
    assert r.stop() == 0
    result = r.result()
    assert result["ok"] is True
    rows = journal_rows(spawn.journal)
    ids = Counter(row["request_id"] for row in rows)
    assert ok == len(sent), "every stream should complete against healthy engines"
    assert set(ids) == set(sent)
    assert max(ids.values()) == 1, "a request id appears twice"
    assert len(rows) == len(sent)
    assert all(row["outcome"] == "ok" for row in rows)
    assert result["data"]["journal_dropped"] == 0
    assert result["data"]["journal_rows"] == len(sent)


@pytest.mark.serve_load
@pytest.mark.timeout(300)
def test_one_row_per_request_at_concurrency_256_for_30_seconds(spawn: Spawner) -> None:
    _run(spawn, concurrency=256, seconds=30.0)
