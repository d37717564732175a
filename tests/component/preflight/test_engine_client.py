"""The measuring client shared by narwhal-profile and narwhal-check, against two emulators."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import pytest

from narwhal.lab.engine.testing import RunningEngine, start_engine, write_tiny_llama
from narwhal.serve.engine_client import EngineCallFailed, EngineClient, handoff
from tests.component.serve.test_with_emulator import ENGINE_ARGS

pytestmark = pytest.mark.timeout(120)
ARGS = ENGINE_ARGS  # the loopback kv_both emulator pair the router tests use


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningEngine, RunningEngine]]:
    root = tmp_path_factory.mktemp("client")
    model = write_tiny_llama(root / "tiny")
    started: list[RunningEngine] = []
    try:
        for name in ("p", "d"):
            started.append(start_engine(model, log_path=root / f"{name}.log", extra_args=ARGS,
                                        env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"}))
        yield started[0], started[1]
    finally:
        for engine in started:
            engine.stop()


def test_a_handoff_moves_the_prompt_into_the_consumer_and_is_timed(
        pair: tuple[RunningEngine, RunningEngine]) -> None:
    async def go() -> tuple[float, float, float, int, list[str], str]:
        async with aiohttp.ClientSession() as session:
            p, d = EngineClient("p", pair[0].url, session), EngineClient("d", pair[1].url, session)
            before = (await d.metrics()).external_kv_tokens()
            done = await handoff(p, d, "tiny", "the sea and the ships upon it " * 8, 4)
            after = (await d.metrics()).external_kv_tokens()
            assert done.decode is not None and done.decode.status == 200, done
            return (before, after, done.first_token_s, done.decode.prompt_tokens,
                    await d.models(), (await p.generation()).engine_version)

    before, after, first, prompt_tokens, models, version = asyncio.run(go())
    assert after - before == prompt_tokens > 0
    assert 0 < first < 5
    assert models == ["tiny"] and version == "0.32.0"


def test_a_stream_times_every_token(pair: tuple[RunningEngine, RunningEngine]) -> None:
    async def go() -> tuple[int, int]:
        async with aiohttp.ClientSession() as session:
            done = await EngineClient("p", pair[0].url, session).stream("tiny", "hello there", 5)
            assert list(done.token_times_s) == sorted(done.token_times_s)
            return len(done.token_times_s), done.completion_tokens

    assert asyncio.run(go()) == (5, 5)


def test_an_unreachable_engine_is_named_with_the_call() -> None:
    async def go() -> EngineCallFailed:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(EngineCallFailed) as err:
                await EngineClient("eng9", "http://127.0.0.1:9", session, timeout_s=2).version()
            return err.value

    failed = asyncio.run(go())
    assert failed.engine_id == "eng9" and failed.what == "GET /version"
    assert str(failed).startswith("eng9: GET /version: ")
