"""The fidelity checks pass against real vLLM, and the saved captures still describe it.

The checks in tests/fidelity compare an engine with the captures in tests/fixtures/vllm-0.32.0;
running them here against the live engines is what keeps those captures honest (a vLLM whose
shapes moved fails here first), so the emulator is always held to current real behaviour.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import pytest

from tests.fidelity import checks, reference
from tests.real.capture import side_channel_frames
from tests.real.live import settled
from tests.real.session import Pair


def _name(check: Callable[..., Any]) -> str:
    return check.__name__.removeprefix("check_")


@pytest.mark.parametrize("check", checks.SINGLE_ENGINE_CHECKS, ids=_name)
def test_real_engine_passes_single_engine_fidelity_check(
    pair: Pair, check: Callable[[str], Any]
) -> None:
    check(pair.prefill.url)


@pytest.mark.parametrize("check", checks.PAIR_CHECKS, ids=_name)
def test_real_pair_passes_pair_fidelity_check(
    pair: Pair, check: Callable[[str, str], Any], provoked_failures: dict[str, int]
) -> None:
    if check is checks.check_failed_handoff:
        provoked_failures["decode"] += 1
    check(pair.prefill.url, pair.decode.url)
    # Let a failure's late counter update land here, not inside a later test's window.
    settled(pair.decode.url, "vllm:nixl_num_failed_transfers_total")


def test_live_side_channel_reply_has_the_captured_wire_shape(pair: Pair) -> None:
    """Same two frames, same payload keys, same metadata keys in the same order."""
    live = side_channel_frames(pair.decode.spec.side_channel_port)
    saved = [reference.path(f"sidechannel-reply.frame{i}.bin").read_bytes() for i in (0, 1)]
    assert len(live) == len(saved) == 2
    live_payload, saved_payload = (msgpack.unpackb(f[0], raw=False) for f in (live, saved))
    assert list(live_payload) == list(saved_payload)
    live_meta = msgpack.unpackb(live_payload["agent_metadata_bytes"], raw=False)
    saved_meta = msgpack.unpackb(saved_payload["agent_metadata_bytes"], raw=False)
    assert list(live_meta) == list(saved_meta)
    assert isinstance(msgpack.unpackb(live[1]), float)
