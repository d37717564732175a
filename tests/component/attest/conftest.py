"""The attested-engine fixture the attestation component tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.component.attest.sidecars import Attested, engine_with_sidecar
from tests.component.serve.harness import call


@pytest.fixture
def attested(tmp_path: Path) -> Iterator[Attested]:
    with engine_with_sidecar(tmp_path) as e:
        doc = call(e.port, "GET", "/v1/attestation").json()
        yield Attested(tmp_path, e.run_dir, f"http://127.0.0.1:{e.engine_port}",
                       f"http://127.0.0.1:{e.port}/v1/attestation", doc)
