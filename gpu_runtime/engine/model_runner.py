"""Owns the model weights, the KV cache tensors and the rope tables on one device, and runs one forward pass per
engine step: flattens the scheduled sequences' new tokens into one batch, builds the attention metadata (slots,
block tables, masks), and returns logits for the positions that need them.

A sequence may bring any number of query tokens (prefill chunk, one decode token, or 1 + k speculative tokens to
verify) and ask for logits at its last num_logits positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from gpu_runtime.config import ModelConfig
from gpu_runtime.model.attention import AttentionGroup, AttentionMetadata, RopeTables
from gpu_runtime.model.cpu_decode import Batch1Decoder, DecoderWatch
from gpu_runtime.model.loader import load_model, load_weights

# Sequences with at most this many query tokens are attended together in one padded SDPA call.
BATCHED_MAX_QUERIES = 16


@dataclass(frozen=True)
class SequenceInput:
    """One sequence's work in a step: token_ids sit at positions start, start + 1, ...; block_ids cover them."""

    token_ids: list[int]
    start: int
    block_ids: list[int]
    num_logits: int = 1


def kv_bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """K and V for every layer of one block."""
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * dtype.itemsize


class ModelRunner:
    def __init__(
        self,
        model_path: Path,
        dtype: torch.dtype,
        device: torch.device,
        max_model_len: int,
        block_size: int,
        num_blocks: int | None = None,
    ) -> None:
        self.model_path = Path(model_path)
        self.dtype, self.device, self.block_size = dtype, device, block_size
        self.model = load_model(self.model_path, dtype, device)
        self.config: ModelConfig = self.model.config
        self.rope = RopeTables.build(self.config, max_model_len, dtype, device)
        self.num_blocks = 0
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._decoder: Batch1Decoder | None = None  # the C batch-1 path (CPU only), built on first use
        self._decoder_watch: DecoderWatch | None = None  # what it was built on: a change builds it anew
        if num_blocks is not None:
            self.allocate_kv_cache(num_blocks)

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """Allocate the KV pool; separate from __init__ because on CUDA its size depends on memory left by weights."""
        shape = (self.config.num_kv_heads, num_blocks * self.block_size, self.config.head_dim)  # head-major
        self.num_blocks = num_blocks
        # Zeroed, not empty: masked-out slots are still multiplied by zero probabilities, and NaN * 0 is NaN.
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
            )
            for _ in range(self.config.num_layers)
        ]

    def reload_weights(self, path: Path | None = None) -> None:
        """Reload weights in place (same shapes); the KV cache stays allocated."""
        load_weights(self.model, Path(path) if path else self.model_path)

    @torch.inference_mode()
    def execute(self, inputs: list[SequenceInput]) -> torch.Tensor:
        """Forward pass over all inputs; returns float32 logits [sum(num_logits), vocab] in input order."""
        fast = self._batch1_decode(inputs)
        if fast is not None:
            return fast
        order = self._order(inputs)
        ordered = [inputs[i] for i in order]
        ids, positions, slots, logit_rows = self._flatten(ordered)
        meta = AttentionMetadata(slots, self._groups(ordered), self.block_size)
        hidden = self.model(ids, positions, self.rope, self.kv_caches, meta)
        logits = self.model.compute_logits(hidden.index_select(0, logit_rows))
        return self._restore_order(logits, ordered, order)

    def _batch1_decode(self, inputs: list[SequenceInput]) -> torch.Tensor | None:
        """One sequence decoding one token over its KV blocks, wherever they lie, through the C kernels where they run
        (gpu_runtime.model.cpu_decode); None where the step takes the PyTorch path."""
        if len(inputs) != 1 or len(inputs[0].token_ids) != 1 or inputs[0].num_logits != 1:
            return None
        s = inputs[0]
        decoder = self._batch1_decoder()  # checked on every batch-1 step: never kept stale
        if decoder is None:
            return None
        hidden = decoder.hidden(s.token_ids[0], s.start, s.block_ids, self.block_size)
        return self.model.compute_logits(hidden)

    def _batch1_decoder(self) -> Batch1Decoder | None:
        if self.device.type != "cpu":
            return None
        watch = self._decoder_watch
        if watch is None or not watch.holds(self.model, self.kv_caches):  # first use, or weights or caches changed
            self._decoder_watch = DecoderWatch.of(self.model, self.kv_caches)
            self._decoder = Batch1Decoder.build(self.model, self.rope, self.kv_caches)
        return self._decoder

    def _order(self, inputs: list[SequenceInput]) -> list[int]:
        """Short-query sequences first (one batched group), then each long prefill on its own."""
        short = [i for i, s in enumerate(inputs) if len(s.token_ids) <= BATCHED_MAX_QUERIES]
        return short + [i for i, s in enumerate(inputs) if len(s.token_ids) > BATCHED_MAX_QUERIES]

    def _restore_order(self, logits: torch.Tensor, ordered: list[SequenceInput], order: list[int]) -> torch.Tensor:
        if order == sorted(order):
            return logits
        chunks = list(logits.split([s.num_logits for s in ordered]))
        by_input = [chunks[0]] * len(order)
        for chunk, original in zip(chunks, order, strict=True):
            by_input[original] = chunk
        return torch.cat(by_input)

    def _flatten(self, seqs: list[SequenceInput]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logit_rows: list[int] = []
        bs = self.block_size
        for s in seqs:
            pos = range(s.start, s.start + len(s.token_ids))
            ids.extend(s.token_ids)
            positions.extend(pos)
            slots.extend(s.block_ids[p // bs] * bs + p % bs for p in pos)
            logit_rows.extend(range(len(ids) - s.num_logits, len(ids)))
        return (self._tensor(ids), self._tensor(positions), self._tensor(slots), self._tensor(logit_rows))

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long).to(self.device, non_blocking=True)

    def _groups(self, seqs: list[SequenceInput]) -> tuple[AttentionGroup, ...]:
        num_short = sum(1 for s in seqs if len(s.token_ids) <= BATCHED_MAX_QUERIES)
        groups: list[AttentionGroup] = []
        if num_short:
            groups.append(self._batched_group(seqs[:num_short]))
        offset = sum(len(s.token_ids) for s in seqs[:num_short])
        for s in seqs[num_short:]:
            groups.append(self._prefill_group(s, offset))
            offset += len(s.token_ids)
        return tuple(groups)

    def _prefill_group(self, s: SequenceInput, offset: int) -> AttentionGroup:
        n = len(s.token_ids)
        if s.start == 0:
            return AttentionGroup(offset, offset + n, 1, None, None, n)
        tables, mask = self._tables_and_mask([s], n)
        return AttentionGroup(offset, offset + n, 1, tables, mask, n)

    def _batched_group(self, seqs: list[SequenceInput]) -> AttentionGroup:
        lengths = [len(s.token_ids) for s in seqs]
        max_q, num_tokens = max(lengths), sum(lengths)
        if lengths == [1]:  # batch-1 decode: attends to its whole context, so no mask or bias to build and add
            s = seqs[0]
            first = _contiguous_first_block(s.block_ids, -(-(s.start + 1) // self.block_size))
            if first is not None:
                return AttentionGroup(0, 1, 1, None, None, 1, num_keys=s.start + 1, key_slot=first * self.block_size)
            return AttentionGroup(0, 1, 1, self._tables(seqs, s.start + 1), None, 1, num_keys=s.start + 1)
        tables, mask = self._tables_and_mask(seqs, max_q)
        bias = torch.zeros(mask.shape, dtype=torch.float32, device=self.device).masked_fill_(~mask, float("-inf"))
        bias = bias[None]  # [1, B, 1, max_q, S]
        if all(n == max_q for n in lengths):
            if max_q == 1 and self.device.type == "cpu":  # plain decode: the C path reads the tables in place
                keys = [s.start + 1 for s in seqs]
                return AttentionGroup(0, num_tokens, len(seqs), tables, None, 1, bias,
                                      seq_keys=torch.tensor(keys, dtype=torch.long), most_keys=max(keys))
            return AttentionGroup(0, num_tokens, len(seqs), tables, None, max_q, bias)
        pad: list[int] = []
        valid: list[int] = []
        offset = 0
        for b, n in enumerate(lengths):
            pad.extend(offset + min(i, n - 1) for i in range(max_q))
            valid.extend(b * max_q + i for i in range(n))
            offset += n
        return AttentionGroup(0, num_tokens, len(seqs), tables, None, 0, bias, 0, self._tensor(pad),
                              self._tensor(valid))

    def _tables(self, seqs: list[SequenceInput], num_tokens: int) -> torch.Tensor:
        """[B, blocks covering num_tokens] block tables, padded with block 0."""
        num_blocks = -(-num_tokens // self.block_size)
        tables = [s.block_ids[:num_blocks] + [0] * (num_blocks - min(len(s.block_ids), num_blocks)) for s in seqs]
        return self._tensor([b for t in tables for b in t]).view(len(seqs), num_blocks)

    def _tables_and_mask(self, seqs: list[SequenceInput], max_q: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Block tables padded with block 0, and mask[b, 0, i, j] = key j is at or before query i's position."""
        bs = self.block_size
        num_blocks = max(-(-(s.start + len(s.token_ids)) // bs) for s in seqs)
        starts = torch.tensor([s.start for s in seqs], dtype=torch.long)
        query_pos = starts[:, None] + torch.arange(max_q)[None, :]  # [B, max_q]
        mask = torch.arange(num_blocks * bs)[None, None, :] <= query_pos[:, :, None]  # [B, max_q, S]
        return self._tables(seqs, num_blocks * bs), mask[:, None].to(self.device)


def _contiguous_first_block(block_ids: list[int], num_blocks: int) -> int | None:
    """The first of the sequence's first num_blocks blocks when they are consecutive ids, else None."""
    first = block_ids[0]
    return first if block_ids[num_blocks - 1] - first == num_blocks - 1 and all(
        b == first + i for i, b in enumerate(block_ids[:num_blocks])) else None
