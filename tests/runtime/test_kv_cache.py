"""BlockManager unit tests: allocation, reference counts, chained prefix hashes, LRU eviction, truncation."""

from __future__ import annotations

from gpu_runtime.engine.block_manager import BlockManager, chain_hashes

BS = 4


def _filled(bm: BlockManager, seq_id: str, tokens: list[int]) -> None:
    """Allocate, 'compute' and publish all of tokens for seq_id."""
    prefix = bm.find_cached_prefix(tokens)
    assert bm.allocate(seq_id, len(tokens), prefix, num_query_tokens=len(tokens))
    bm.cache_full_blocks(seq_id, tokens, len(tokens))


def test_allocate_grows_tables_and_refuses_when_full() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    assert bm.allocate("a", 5)
    assert len(bm.block_ids("a")) == 2
    assert bm.allocate("a", 8)  # still two blocks
    assert len(bm.block_ids("a")) == 2
    assert bm.allocate("b", 8)
    assert not bm.allocate("a", 9)  # would need a fifth block
    assert bm.block_ids("a") == bm.block_ids("a")[:2] and bm.num_free_blocks == 0
    bm.free("b")
    assert bm.allocate("a", 9) and bm.num_free_blocks == 1
    assert bm.usage == 0.75


def test_chained_hashes_depend_on_the_whole_prefix() -> None:
    a = chain_hashes([1, 2, 3, 4, 5, 6, 7, 8], BS, 2)
    b = chain_hashes([9, 2, 3, 4, 5, 6, 7, 8], BS, 2)
    assert a[1] != b[1]  # same second block, different first block
    assert chain_hashes([1, 2, 3, 4, 5, 6, 7, 8], BS, 2) == a


def test_prefix_hit_shares_blocks_and_counts_tokens() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS)
    prompt = list(range(10))
    _filled(bm, "a", prompt)
    prefix = bm.find_cached_prefix([*prompt[:9], 99])
    assert prefix.num_tokens == 8 and prefix.block_ids == tuple(bm.block_ids("a")[:2])
    assert bm.allocate("b", 10, prefix, num_query_tokens=10)
    assert bm.block_ids("b")[:2] == bm.block_ids("a")[:2]
    assert bm.blocks[bm.block_ids("a")[0]].ref_count == 2
    assert (bm.prefix_cache_queries_tokens, bm.prefix_cache_hits_tokens) == (20, 8)


def test_full_prompt_hit_leaves_one_token_to_compute() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS)
    _filled(bm, "a", list(range(8)))
    assert bm.find_cached_prefix(list(range(8))).num_tokens == 4


def test_freed_cached_blocks_revive_until_evicted_lru_first() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    _filled(bm, "old", [1, 2, 3, 4])
    _filled(bm, "new", [5, 6, 7, 8])
    bm.free("old")
    bm.free("new")
    assert bm.num_free_blocks == 4
    assert bm.find_cached_prefix([1, 2, 3, 4, 0]).num_tokens == 4  # still cached while free
    assert bm.allocate("x", 8)  # takes the two never-used blocks first
    assert bm.find_cached_prefix([1, 2, 3, 4, 0]).num_tokens == 4
    assert bm.allocate("y", 4)  # next comes the least recently freed: "old"
    assert bm.find_cached_prefix([1, 2, 3, 4, 0]).num_tokens == 0
    assert bm.find_cached_prefix([5, 6, 7, 8, 0]).num_tokens == 4


def test_reviving_a_free_cached_block_takes_it_off_the_free_queue() -> None:
    bm = BlockManager(num_blocks=2, block_size=BS)
    _filled(bm, "a", [1, 2, 3, 4])
    bm.free("a")
    prefix = bm.find_cached_prefix([1, 2, 3, 4, 5])
    assert bm.allocate("b", 5, prefix)
    assert bm.num_free_blocks == 0 and bm.blocks[prefix.block_ids[0]].ref_count == 1
    assert not bm.allocate("c", 1)


def test_prefix_caching_off_stops_lookups_and_publishing() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    _filled(bm, "a", list(range(9)))
    bm.enable_prefix_caching = True
    assert bm.find_cached_prefix(list(range(9))).num_tokens == 0
    assert bm.prefix_cache_queries_tokens == 0


def test_truncate_returns_blocks_and_unpublishes_partial_ones() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS)
    tokens = list(range(12))
    _filled(bm, "a", tokens)
    bm.truncate("a", 6)
    assert len(bm.block_ids("a")) == 2 and bm.num_free_blocks == 6
    assert bm.find_cached_prefix(tokens).num_tokens == 4  # block 2 (tokens 4..7) will be overwritten: forgotten
    assert bm.allocate("a", 8)
    bm.cache_full_blocks("a", [*tokens[:6], 50, 51], 8)
    assert bm.find_cached_prefix([*tokens[:6], 50, 51, 0]).num_tokens == 8


def test_free_unknown_sequence_is_harmless() -> None:
    bm = BlockManager(num_blocks=2, block_size=BS)
    bm.free("nobody")
    assert bm.num_free_blocks == 2
