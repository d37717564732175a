"""narwhal-inference 0.7.0's router serves completions and chat through two Narwhal emulators.

The router is the PyPI release, started as its operators start it (`narwhal-serve --fleet F`),
with a v2 fleet and a profiles file both written by our own scripts/baselines helper. Its
prefill leg must reach the prefill engine as a one-token `do_remote_decode` request and its
decode leg must pull the KV through the emulators' NIXL path, which the decode engine counts
as `external_kv_transfer` prompt tokens.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.component.baselines import shapes
from tests.component.baselines.conftest import SCRIPTS, EnginePair, our_python, router_env
from tests.component.baselines.flows import (
    ROUTE_IDS,
    ROUTES,
    assert_failed_handoff_is_an_error,
    assert_routed,
)
from tests.component.baselines.harness import (
    OwnedProcess,
    free_port,
    post_json,
    sse_objects,
    wait_ready,
)

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def router(
    engines: EnginePair, narwhal_inference_venv: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """narwhal-serve on a free loopback port over the module's two engines."""
    folder = tmp_path_factory.mktemp("narwhal-inference")
    writer = [our_python(), str(SCRIPTS / "narwhal_inference_fleet.py")]
    subprocess.run(
        [*writer, "fleet", "--model", engines.model, "--prefill", engines.prefill.url,
         "--decode", engines.decode.url, "--dir", str(folder)],
        check=True, capture_output=True, timeout=30,
    )
    subprocess.run(
        [*writer, "profiles", "--fleet", str(folder / "fleet.json")],
        check=True, capture_output=True, timeout=30,
    )
    port = free_port()
    proc = OwnedProcess(
        [str(narwhal_inference_venv / "bin" / "narwhal-serve"), "--fleet",
         str(folder / "fleet.json"), "--host", "127.0.0.1", "--port", str(port)],
        log_path=folder / "router.log", env=router_env(), cwd=folder,
    ).start()
    try:
        wait_ready(f"http://127.0.0.1:{port}/ready", proc, timeout_s=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


@pytest.mark.parametrize(("endpoint", "stream"), ROUTES, ids=ROUTE_IDS)
def test_router_serves_through_two_emulators(
    router: str, engines: EnginePair, endpoint: str, stream: bool
) -> None:
    """A client gets a vLLM-shaped 200 and the KV moved from prefill to decode over NIXL."""
    assert_routed(router, engines, endpoint, stream)


def test_client_does_not_see_engine_token_ids(router: str, engines: EnginePair) -> None:
    """The router asks the decode engine for token_ids and strips them unless the client asked."""
    reply = post_json(
        f"{router}/v1/completions",
        {"model": engines.model, "prompt": "strip the ids", "max_tokens": 4, "stream": True},
    )
    assert reply.status == 200, reply.body[:400]
    chunks, done = sse_objects(reply.body)
    shapes.stream_chunks(chunks, done, chat=False, model=engines.model, max_tokens=4,
                         usage_chunk=False)
    assert all("token_ids" not in c for chunk in chunks for c in chunk["choices"]), chunks


def test_failed_handoff_is_an_error_not_a_local_prefill(
    router: str, engines: EnginePair
) -> None:
    """narwhal-inference fails the request (and quarantines the pair), so it runs last here."""
    assert_failed_handoff_is_an_error(router, engines)
