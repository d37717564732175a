"""The contract gate: each pair's predicted KV contract (core/kv) against a live capture.

The prediction needs each engine's launch plan and the live side needs Gate C's captures of
the engines' NIXL side-channel metadata. Gate C does not write captures in this revision, so
there is nothing honest to compare against: the verdict is SKIP with that reason, never PASS.
The kv gate's live handoffs remain the evidence that every checked pair can move KV.
"""

from __future__ import annotations

from narwhal.serve.preflight.state import CheckState
from narwhal.serve.preflight.verdicts import Verdict, skipped

REASON = ("no Gate C live captures exist in this revision (narwhal-engine does not write them "
          "yet), so the predicted KV contract of each pair cannot be compared with a capture; "
          "the kv gate's live handoffs are the evidence that pairs are compatible")


async def contract(state: CheckState) -> list[Verdict]:
    del state  # nothing to read until Gate C captures exist
    return [skipped("contract", "fleet", REASON)]
