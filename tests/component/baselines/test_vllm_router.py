"""vllm-router 0.1.17 in P/D mode serves completions and chat through two Narwhal emulators.

The router is the PyPI release, started as its docs start a NIXL P/D pair:
`vllm-router --vllm-pd-disaggregation --prefill URL none --decode URL --kv-connector nixl`.
It relays the decode engine's reply unchanged, so every shape a client checks here is the
emulator's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.component.baselines.conftest import EnginePair, router_env
from tests.component.baselines.flows import (
    ROUTE_IDS,
    ROUTES,
    assert_failed_handoff_is_an_error,
    assert_routed,
)
from tests.component.baselines.harness import OwnedProcess, free_port, wait_ready

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def router(
    engines: EnginePair, vllm_router_venv: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """vllm-router on a free loopback port (and a free Prometheus port) over the two engines."""
    folder = tmp_path_factory.mktemp("vllm-router")
    port = free_port()
    proc = OwnedProcess(
        [str(vllm_router_venv / "bin" / "vllm-router"), "--vllm-pd-disaggregation",
         "--prefill", engines.prefill.url, "none", "--decode", engines.decode.url,
         "--kv-connector", "nixl", "--host", "127.0.0.1", "--port", str(port),
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
        log_path=folder / "router.log", env=router_env(), cwd=folder,
    ).start()
    try:
        wait_ready(f"http://127.0.0.1:{port}/health", proc, timeout_s=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


@pytest.mark.parametrize(("endpoint", "stream"), ROUTES, ids=ROUTE_IDS)
def test_router_serves_through_two_emulators(
    router: str, engines: EnginePair, endpoint: str, stream: bool
) -> None:
    """A client gets a vLLM-shaped 200 and the KV moved from prefill to decode over NIXL."""
    assert_routed(router, engines, endpoint, stream)


def test_failed_handoff_reaches_the_client_as_vllm_error(
    router: str, engines: EnginePair
) -> None:
    """vllm-router relays the decode engine's own error reply: vLLM's 500 error shape."""
    body = assert_failed_handoff_is_an_error(router, engines)
    assert body["error"].get("code") == 500 and body["error"].get("type"), body
