"""The paged KV cache's block manager: a fixed pool of blocks, per-sequence block tables, reference counts, and
prefix caching by chained hashes of full blocks with LRU eviction of free cached blocks. Pure Python (no torch);
the KV tensors themselves live in the model runner and are indexed by the block ids handed out here.

A full block's hash is hash((parent block hash, its token ids)), so a hit means the whole prefix matches
(vLLM's automatic prefix caching). Free blocks sit in one LRU queue; a free block that still carries a hash can be
revived by a later request until it is handed out again, which evicts its hash.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None


@dataclass(frozen=True)
class CachedPrefix:
    """Blocks that already hold the KV of a request's first num_tokens tokens."""

    block_ids: tuple[int, ...] = ()
    num_tokens: int = 0


def chain_hashes(token_ids: Sequence[int], block_size: int, num_blocks: int, parent: int | None = None) -> list[int]:
    """Hashes of the first num_blocks full blocks, each chained on its predecessor's hash."""
    hashes: list[int] = []
    for i in range(num_blocks):
        parent = hash((parent, tuple(token_ids[i * block_size : (i + 1) * block_size])))
        hashes.append(parent)
    return hashes


class BlockManager:
    """Hands out KV blocks to sequences (keyed by request id) and keeps the prefix cache."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._tables: dict[str, list[int]] = {}
        self._hashes: dict[str, list[int]] = {}  # hashes of a sequence's registered full blocks
        self.prefix_cache_queries_tokens = 0
        self.prefix_cache_hits_tokens = 0

    @property
    def num_total_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by sequences (free cached blocks count as free, as in vLLM)."""
        return 1.0 - len(self._free) / len(self.blocks)

    def block_ids(self, seq_id: str) -> list[int]:
        return self._tables.get(seq_id, [])

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def find_cached_prefix(self, token_ids: Sequence[int]) -> CachedPrefix:
        """Longest cached run of full blocks; at least one token is left to compute so the step yields logits."""
        if not self.enable_prefix_caching:
            return CachedPrefix()
        num_full = (len(token_ids) - 1) // self.block_size
        found: list[int] = []
        for block_hash in chain_hashes(token_ids, self.block_size, num_full):
            block_id = self._cached.get(block_hash)
            if block_id is None:
                break
            found.append(block_id)
        return CachedPrefix(tuple(found), len(found) * self.block_size)

    def can_allocate(self, seq_id: str, num_total_tokens: int) -> bool:
        """Whether seq_id's existing table can grow to cover num_total_tokens from the free blocks."""
        return self.blocks_needed(num_total_tokens) - len(self._tables.get(seq_id, [])) <= len(self._free)

    def allocate(
        self, seq_id: str, num_total_tokens: int, prefix: CachedPrefix = CachedPrefix(), num_query_tokens: int = 0
    ) -> bool:
        """Grow seq_id's table to cover num_total_tokens, first reusing `prefix` (only for a new table).

        Returns False, changing nothing, when the pool cannot supply the blocks. num_query_tokens > 0 records a
        prefix-cache lookup of that many tokens (hits = prefix.num_tokens) once the allocation succeeds.
        """
        table = self._tables.get(seq_id, [])
        reused = prefix.block_ids if not table else ()
        num_new = self.blocks_needed(num_total_tokens) - len(table) - len(reused)
        revived = sum(1 for b in reused if self.blocks[b].ref_count == 0)
        if num_new + revived > len(self._free):
            return False
        for block_id in reused:
            self._touch(block_id)
        table = [*table, *reused, *(self._take_free() for _ in range(max(num_new, 0)))]
        self._tables[seq_id] = table
        if reused:
            self._hashes[seq_id] = [self.blocks[b].block_hash for b in reused]  # type: ignore[misc]
        if num_query_tokens and self.enable_prefix_caching:
            self.prefix_cache_queries_tokens += num_query_tokens
            self.prefix_cache_hits_tokens += prefix.num_tokens
        return True

    def free(self, seq_id: str) -> None:
        """Drop a sequence's references; tail blocks enter the LRU queue first so they are evicted first."""
        for block_id in reversed(self._tables.pop(seq_id, [])):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
        self._hashes.pop(seq_id, None)

    def cache_full_blocks(self, seq_id: str, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """Register the hashes of seq_id's blocks that are full of computed tokens (so later requests can hit)."""
        if not self.enable_prefix_caching:
            return
        table, hashes = self._tables.get(seq_id, []), self._hashes.setdefault(seq_id, [])
        num_full = min(num_computed_tokens // self.block_size, len(table))
        if num_full <= len(hashes):
            return
        parent = hashes[-1] if hashes else None
        start = len(hashes) * self.block_size
        new = chain_hashes(token_ids[start:], self.block_size, num_full - len(hashes), parent)
        for block_id, block_hash in zip(table[len(hashes) : num_full], new, strict=True):
            block = self.blocks[block_id]
            if block.block_hash is None and block_hash not in self._cached:
                block.block_hash = block_hash
                self._cached[block_hash] = block_id
            hashes.append(block_hash)

    def truncate(self, seq_id: str, num_tokens: int) -> None:
        """Roll a sequence back to its first num_tokens tokens (speculative decoding rejects drafts).

        Blocks past the new end return to the pool; a kept block that will be overwritten loses its hash.
        """
        table = self._tables.get(seq_id, [])
        keep = self.blocks_needed(num_tokens)
        for block_id in reversed(table[keep:]):
            self._release(block_id)
        del table[keep:]
        hashes = self._hashes.get(seq_id, [])
        num_full = num_tokens // self.block_size
        for block_id in table[num_full:]:
            self._forget(block_id)
        del hashes[num_full:]

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self._forget(block_id)
            self._free[block_id] = None

    def _forget(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.block_hash is not None and self._cached.get(block.block_hash) == block_id:
            del self._cached[block.block_hash]
        block.block_hash = None

    def _touch(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1

    def _take_free(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        self._forget(block_id)  # evicts the LRU cached block's hash, if it had one
        self.blocks[block_id].ref_count = 1
        return block_id
