"""Every 503 the attestation sidecar sends carries a `kind` its readers act on."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest

from narwhal.core.sidecar_answer import RefusalKind, read_answer
from narwhal.node.attest import server
from narwhal.node.attest.document import Attested, Changed

DIGEST = "sha256:" + "a" * 64


@pytest.fixture
def sidecar(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, list[Changed]]]:
    """A sidecar on loopback whose engine check raises what the test puts in `faults`."""
    faults: list[Changed] = []

    def verify(_: Attested, timeout_s: float = 3.0) -> None:
        if faults:
            raise faults[0]

    monkeypatch.setattr(server, "verify", verify)
    attested = cast(Attested, SimpleNamespace(document={"engine": "engine-1", "digest": DIGEST}))
    httpd = server.serve(attested, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", faults
    finally:
        httpd.shutdown()
        httpd.server_close()


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{url}/v1/attestation", timeout=5) as reply:  # noqa: S310
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize(("kind", "changed"), [("process_changed", True),
                                               ("layout_changed", True),
                                               ("unreadable", False)])
def test_each_refusal_names_its_kind_and_keeps_the_words_operators_read(
        sidecar: tuple[str, list[Changed]], kind: RefusalKind, changed: bool) -> None:
    url, faults = sidecar
    assert _get(url) == (200, {"engine": "engine-1", "digest": DIGEST})
    faults.append(Changed(kind, "the sidecar's own words"))
    status, body = _get(url)
    assert (status, body) == (503, {"kind": kind, "error": "the sidecar's own words",
                                    "engine": "engine-1", "attested_digest": DIGEST})
    assert read_answer(status, body, DIGEST).process_changed is changed
