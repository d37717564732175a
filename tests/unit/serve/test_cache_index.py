"""The router's view of engine caches: events applied in order, gaps forgotten, history LRU."""

from __future__ import annotations

from narwhal.core.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from narwhal.serve.router.cache.fleet import FleetCache, PromptKeys
from narwhal.serve.router.cache.index import EngineCache

BS = 4
PROMPT = list(range(1, 18))  # 4 full blocks and one token


def _stored(hashes: tuple[int, ...], tokens: list[int], parent: int | None = None
            ) -> BlockStored:
    return BlockStored(hashes, parent, tuple(tokens), BS, "GPU")


def _fleet(**caches: EngineCache) -> FleetCache:
    return FleetCache(caches)


def test_engines_with_different_hash_seeds_key_the_same_tokens_alike() -> None:
    a, b = EngineCache("events", 64), EngineCache("events", 64)
    a.apply(EventBatch(0, 0.0, (_stored((11, 12), PROMPT[:8]),)))
    # b names the same blocks by other hashes, and stores them in two events chained by parent
    b.apply(EventBatch(0, 0.0, (_stored((901,), PROMPT[:4]), _stored((902,), PROMPT[4:8], 901))))
    assert _fleet(a=a, b=b).matched_tokens(PromptKeys(PROMPT)) == {"a": 8, "b": 8}


def test_a_hit_never_covers_the_last_prompt_token() -> None:
    a = EngineCache("events", 64)
    a.apply(EventBatch(0, 0.0, (_stored((1, 2, 3, 4), PROMPT[:16]),)))
    assert _fleet(a=a).matched_tokens(PromptKeys(PROMPT[:16])) == {"a": 12}
    assert _fleet(a=a).matched_tokens(PromptKeys(PROMPT)) == {"a": 16}


def test_a_removed_block_ends_the_match_where_it_was() -> None:
    a = EngineCache("events", 64)
    a.apply(EventBatch(0, 0.0, (_stored((1, 2, 3), PROMPT[:12]),)))
    a.apply(EventBatch(1, 0.0, (BlockRemoved((2,)),)))
    assert _fleet(a=a).matched_tokens(PromptKeys(PROMPT)) == {"a": 4}
    a.apply(EventBatch(2, 0.0, (AllBlocksCleared(),)))
    assert a.blocks == 0 and a.counts["cleared"] == 1


def test_a_missed_batch_forgets_what_was_known_so_no_hit_is_overpredicted() -> None:
    a = EngineCache("events", 64)
    a.apply(EventBatch(0, 0.0, (_stored((1, 2), PROMPT[:8]),)))
    a.apply(EventBatch(2, 0.0, (_stored((7,), [50, 51, 52, 53]),)))  # batch 1 was lost
    assert a.counts["gaps"] == 1
    assert _fleet(a=a).matched_tokens(PromptKeys(PROMPT)) == {"a": 0}
    assert _fleet(a=a).matched_tokens(PromptKeys([50, 51, 52, 53, 54])) == {"a": 4}
    a.apply(EventBatch(0, 0.0, ()))  # the publisher restarted: its numbers begin again
    assert a.counts["gaps"] == 2 and a.blocks == 0


def test_a_block_whose_parent_is_unknown_is_not_keyed() -> None:
    a = EngineCache("events", 64)
    a.apply(EventBatch(0, 0.0, (_stored((5,), PROMPT[4:8], parent=4),)))
    assert a.blocks == 0 and a.counts["orphans"] == 1


def test_a_refused_frame_forgets_the_engine_s_blocks() -> None:
    a = EngineCache("events", 64)
    a.apply(EventBatch(0, 0.0, (_stored((1,), PROMPT[:4]),)))
    a.refused()
    assert a.blocks == 0 and a.state()["events"]["refused"] == 1  # type: ignore[index]


def test_the_approximate_mode_learns_from_routing_and_forgets_the_oldest() -> None:
    a = EngineCache("approximate", capacity_blocks=4, block_size=BS)
    fleet = _fleet(a=a)
    fleet.routed("a", PromptKeys(PROMPT))
    assert fleet.matched_tokens(PromptKeys(PROMPT)) == {"a": 16}
    fleet.routed("a", PromptKeys(list(range(100, 108))))  # two new blocks push two out
    assert fleet.matched_tokens(PromptKeys(PROMPT)) == {"a": 0}
    assert a.state() == {"mode": "approximate", "block_size": BS, "blocks": 4,
                         "capacity_blocks": 4}


def test_an_events_engine_does_not_learn_from_routing() -> None:
    a = EngineCache("events", 64, block_size=BS)
    _fleet(a=a).routed("a", PromptKeys(PROMPT))
    assert a.blocks == 0
