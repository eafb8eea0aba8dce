"""One forward pass and what is drawn from it: the scheduled sequences' query tokens go through the model runner,
each completing sequence gets its logits rows processed (penalties, bias, bans), then either sampled (one token) or
verified against its speculative drafts (up to 1 + drafts tokens), and scored for logprobs where it asked."""

from __future__ import annotations

import torch

from gpu_runtime.engine.block_manager import BlockManager
from gpu_runtime.engine.logits_processing import processed_rows
from gpu_runtime.engine.logprobs import TokenLogprob, step_logprobs
from gpu_runtime.engine.model_runner import ModelRunner, SequenceInput
from gpu_runtime.engine.sampling import Sampler
from gpu_runtime.engine.scheduler import ScheduledSequence, SchedulerOutput
from gpu_runtime.speculative.decoder import SpeculativeDecoder


class ForwardStep:
    def __init__(self, runner: ModelRunner, block_manager: BlockManager, sampler: Sampler,
                 eos_token_ids: frozenset[int] | set[int] | tuple[int, ...]) -> None:
        self.runner, self.block_manager, self.sampler = runner, block_manager, sampler
        self.eos_token_ids = eos_token_ids

    def run(
        self, sched: SchedulerOutput, completing: list[ScheduledSequence], spec: SpeculativeDecoder | None
    ) -> tuple[list[list[int]], list[list[TokenLogprob] | None]]:
        """The new tokens of each completing sequence (1, or up to 1 + drafts) and their logprobs where asked."""
        inputs = [
            SequenceInput(
                query_tokens(item),
                item.start,
                self.block_manager.block_ids(item.seq.request_id),
                1 + item.num_spec_tokens if item.completes else 0,
            )
            for item in sched.scheduled
        ]
        logits = self.runner.execute(inputs)
        rows = logits.split([1 + item.num_spec_tokens for item in completing])
        seqs = [item.seq for item in completing]
        drawn_from = processed_rows(rows, [s.params for s in seqs], [s.num_output_tokens for s in seqs],
                                    self.eos_token_ids)
        tokens: list[list[int]] = [[] for _ in completing]
        plain = [i for i, item in enumerate(completing) if not item.num_spec_tokens]
        if plain:
            sampled = self.sampler.sample(
                torch.cat([drawn_from[i] for i in plain]), [seqs[i].params for i in plain],
                [seqs[i].request_id for i in plain],
            )
            for i, token in zip(plain, sampled, strict=True):
                tokens[i] = [token]
        speculated = [i for i, item in enumerate(completing) if item.num_spec_tokens]
        if speculated and spec is not None:
            items = [completing[i] for i in speculated]
            drafts = [item.seq.spec_token_ids[: item.num_spec_tokens] for item in items]
            verified = spec.verify([item.seq for item in items], drafts, [drawn_from[i] for i in speculated])
            for i, new_tokens in zip(speculated, verified, strict=True):
                tokens[i] = new_tokens
        return tokens, step_logprobs(list(rows), tokens, [item.seq.params.logprobs for item in completing])


def query_tokens(item: ScheduledSequence) -> list[int]:
    """The step's query tokens of one sequence: its uncomputed tokens, then the drafts that fit the budget."""
    seq, end = item.seq, item.start + item.num_new_tokens
    if not item.num_spec_tokens:
        return seq.token_ids[item.start : end]
    return seq.token_ids[item.start :] + seq.spec_token_ids[: item.num_spec_tokens]
