"""Draft-model proposer: a smaller checkpoint with the target's tokenizer drafts k tokens autoregressively.

The draft runs on its own ModelRunner (own weights, own KV tensors) but shares the target's block tables: a token at
position p has its draft K/V at the same slot as its target K/V, just in the draft's tensors, so the draft needs no
block manager of its own and the target's preemption and rollback apply to both (the approach of vLLM's EAGLE and
draft-model workers). Per request it remembers up to where its KV was computed from real tokens; each round first
catches up on the tokens it has not seen (the whole prompt for a new request, else the last one or two tokens),
then drafts one token per forward pass. After verification only the positions holding accepted tokens stay valid.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from gpu_runtime.checkpoint.files import read_model_config
from gpu_runtime.config import ModelConfig, SamplingParams
from gpu_runtime.engine.model_runner import ModelRunner, SequenceInput
from gpu_runtime.engine.sequence import Sequence

ProbsFn = Callable[[torch.Tensor, list[SamplingParams]], torch.Tensor]


@dataclass(frozen=True)
class Draft:
    """Drafted tokens of one sequence and, for sampled requests, the draft distributions they were drawn from."""

    token_ids: list[int]
    probs: torch.Tensor | None  # [len(token_ids), vocab]; None for greedy requests


@dataclass
class _DraftKV:
    num_computed_tokens: int  # the draft's KV holds positions [0, num_computed_tokens) of the real tokens
    num_preemptions: int  # a preemption frees the blocks, and with them the draft's KV


class DraftModelProposer:
    def __init__(self, runner: ModelRunner, probs_fn: ProbsFn, seed: int = 0) -> None:
        self.runner = runner
        self._probs_fn = probs_fn
        self._kv: dict[str, _DraftKV] = {}
        self._generator = torch.Generator(device=runner.device).manual_seed(seed)

    @classmethod
    def load(
        cls, path: Path, target: ModelConfig, runner_args: tuple[torch.dtype, torch.device, int, int, int],
        probs_fn: ProbsFn, seed: int = 0,
    ) -> DraftModelProposer:
        """runner_args: (dtype, device, max_model_len, block_size, num_blocks) of the target's runner."""
        try:
            draft_cfg = read_model_config(Path(path))
        except ValueError as error:
            raise ValueError(f"draft model: {error}") from error
        if draft_cfg.vocab_size != target.vocab_size:
            raise ValueError(
                f"draft model {path} has vocab size {draft_cfg.vocab_size}, the target {target.vocab_size}: "
                "a draft must share the target's tokenizer"
            )
        dtype, device, max_model_len, block_size, num_blocks = runner_args
        try:
            runner = ModelRunner(Path(path), dtype, device, max_model_len, block_size, num_blocks)
        except torch.OutOfMemoryError as error:
            # The draft's KV has as many blocks as the target's; on a full GPU that may not fit.
            raise ValueError(f"no memory for draft model {path} and its KV cache ({num_blocks} blocks): lower "
                             "--gpu-memory-utilization or use a smaller draft") from error
        return cls(runner, probs_fn, seed)

    def forget_except(self, live_request_ids: set[str]) -> None:
        for rid in [r for r in self._kv if r not in live_request_ids]:
            del self._kv[rid]

    def _num_valid(self, seq: Sequence) -> int:
        kv = self._kv.get(seq.request_id)
        if kv is None or kv.num_preemptions != seq.num_preemptions:
            return 0
        # Positions before the last real token hold accepted tokens; later ones held drafts, maybe rejected.
        return min(kv.num_computed_tokens, seq.num_tokens - 1)

    def propose(self, seqs: list[Sequence], ks: list[int], block_tables: list[list[int]]) -> list[Draft]:
        """Draft ks[i] >= 1 tokens for seqs[i]; block_tables[i] must cover num_tokens + ks[i] - 1 positions."""
        drafts: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        inputs = [
            SequenceInput(seq.token_ids[self._num_valid(seq) :], self._num_valid(seq), table, 1)
            for seq, table in zip(seqs, block_tables, strict=True)
        ]
        active = list(range(len(seqs)))
        while active:
            logits = self.runner.execute(inputs)  # [len(active), vocab]
            tokens, q = self._choose(logits, [seqs[i].params for i in active])
            for row, i in enumerate(active):
                drafts[i].append(tokens[row])
                if q is not None and not seqs[i].params.greedy:
                    probs[i].append(q[row])
            active = [i for i in active if len(drafts[i]) < ks[i]]
            inputs = [
                SequenceInput([drafts[i][-1]], seqs[i].num_tokens - 1 + len(drafts[i]), block_tables[i], 1)
                for i in active
            ]
        for seq, draft in zip(seqs, drafts, strict=True):
            self._kv[seq.request_id] = _DraftKV(seq.num_tokens - 1 + len(draft), seq.num_preemptions)
        return [Draft(d, torch.stack(p) if p else None) for d, p in zip(drafts, probs, strict=True)]

    def _choose(self, logits: torch.Tensor, params: list[SamplingParams]) -> tuple[list[int], torch.Tensor | None]:
        """Greedy rows take the argmax; sampled rows draw from the processed draft distribution q."""
        greedy = logits.argmax(dim=-1)
        if all(p.greedy for p in params):
            return greedy.tolist(), None
        q = self._probs_fn(logits, params)  # [N, vocab]
        noise = torch.empty_like(q).exponential_(generator=self._generator)
        sampled = (q / noise).argmax(dim=-1)  # exponential race: index i with probability q_i
        is_greedy = torch.tensor([p.greedy for p in params], device=logits.device)
        return torch.where(is_greedy, greedy, sampled).tolist(), q
