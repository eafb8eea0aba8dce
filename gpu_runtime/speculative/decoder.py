"""Speculative decoding inside the engine's step: drafts around scheduling, verification after the forward.

`prepare` runs before the scheduler: every running sequence that is decoding (all but its last token computed) may
get drafts. Prompt lookup proposes them right away into `seq.spec_token_ids` (pure Python, no KV). `num_lookahead`
tells the scheduler how many draft slots each sequence wants; the scheduler, the only owner of KV blocks, schedules
1 + n query tokens (fewer when the token budget is short) and allocates their blocks. `fill` then runs a draft model
over the scheduled sequences, writing its K/V into exactly those blocks (the draft's KV tensors are indexed by the
target's block ids), so the target scores every draft of the whole batch, prefill chunks included, in the step's one
forward pass. `verify` turns each sequence's 1 + n logits rows into the accepted drafts plus one target token; the
scheduler then rolls the sequence's computed tokens (and KV blocks) back to the accepted ones. Drafts never outrun
max_tokens or max_model_len, so a step emits at most what the request may still produce.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gpu_runtime.config import SamplingParams
from gpu_runtime.engine.scheduler import SchedulerOutput
from gpu_runtime.engine.sequence import Sequence
from gpu_runtime.speculative.config import SpecMethod, SpeculativeSettings
from gpu_runtime.speculative.draft import DraftModelProposer, ProbsFn
from gpu_runtime.speculative.ngram import NgramProposer
from gpu_runtime.speculative.rejection import VerifyOutput, pad_drafts, rejection_sample, verify_greedy

GeneratorFn = Callable[[str, SamplingParams], torch.Generator | None]
BlockIdsFn = Callable[[str], list[int]]  # the scheduler's block table of a request (read only)


@dataclass
class SpecCounters:
    """Cumulative counters behind vllm:spec_decode_* (docs/facts.md#metrics)."""

    num_drafts: int = 0  # verification rounds of a sequence with at least one draft token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def record(self, num_draft: list[int], num_accepted: list[int]) -> None:
        for n, a in zip(num_draft, num_accepted, strict=True):
            if n == 0:
                continue
            if len(self.num_accepted_tokens_per_pos) < n:  # k may grow when speculation is reconfigured
                self.num_accepted_tokens_per_pos.extend([0] * (n - len(self.num_accepted_tokens_per_pos)))
            self.num_drafts += 1
            self.num_draft_tokens += n
            self.num_accepted_tokens += a
            for pos in range(a):
                self.num_accepted_tokens_per_pos[pos] += 1


def _padded(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """Ragged [n_i, V] tensors -> [B, width, V], zero past each n_i."""
    out = rows[0].new_zeros((len(rows), width, rows[0].shape[-1]))
    for b, row in enumerate(rows):
        out[b, : row.shape[0]] = row
    return out


class SpeculativeDecoder:
    def __init__(
        self, settings: SpeculativeSettings, max_model_len: int,
        probs_fn: ProbsFn, generator_fn: GeneratorFn, counters: SpecCounters,
        draft: DraftModelProposer | None = None,
    ) -> None:
        if (settings.method is SpecMethod.DRAFT_MODEL) != (draft is not None):
            raise ValueError("a draft proposer is needed exactly when the method is draft_model")
        self.settings = settings
        self.draft = draft
        self._ngram = NgramProposer(settings)
        self._max_model_len = max_model_len
        self._probs_fn = probs_fn
        self._generator_fn = generator_fn
        self._draft_probs: dict[str, torch.Tensor] = {}
        self.counters = counters

    def _max_draft(self, seq: Sequence) -> int:
        """At most k, and never so many that accepting all (+1 bonus) would pass max_tokens or max_model_len."""
        if seq.num_computed_tokens != seq.num_tokens - 1:
            return 0  # still prefilling
        room = min(seq.params.max_tokens - seq.num_output_tokens, self._max_model_len - seq.num_tokens) - 1
        return max(0, min(self.settings.num_speculative_tokens, room))

    def prepare(self, running: list[Sequence]) -> None:
        """Before scheduling: clear last step's drafts; prompt lookup proposes this step's (no KV involved)."""
        self._draft_probs.clear()
        for seq in running:
            seq.spec_token_ids = []
        if self.draft is not None:
            self.draft.forget_except({seq.request_id for seq in running})
            return
        for seq in running:
            k = self._max_draft(seq)
            if k > 0:
                seq.spec_token_ids = self._ngram.propose(seq.token_ids, k)

    def num_lookahead(self, seq: Sequence) -> int:
        """Draft slots the sequence wants this step: its n-gram drafts, or k for a draft model still to run."""
        return len(seq.spec_token_ids) if self.draft is None else self._max_draft(seq)

    def fill(self, sched: SchedulerOutput, block_ids: BlockIdsFn) -> None:
        """After scheduling: a draft model drafts exactly the slots each sequence was given, its K/V going into the
        blocks the scheduler allocated for them (positions up to num_tokens + n - 2; the target verifies up to
        num_tokens + n - 1)."""
        items = [item for item in sched.scheduled if item.num_spec_tokens]
        if self.draft is None or not items:
            return
        drafts = self.draft.propose([item.seq for item in items], [item.num_spec_tokens for item in items],
                                    [block_ids(item.seq.request_id) for item in items])
        for item, draft in zip(items, drafts, strict=True):
            item.seq.spec_token_ids = draft.token_ids
            if draft.probs is not None:
                self._draft_probs[item.seq.request_id] = draft.probs

    def verify(self, seqs: list[Sequence], drafts: list[list[int]], logits: list[torch.Tensor]) -> list[list[int]]:
        """logits[i]: the target's [len(drafts[i]) + 1, V] rows for seqs[i] -> tokens to append to it."""
        results: list[list[int]] = [[] for _ in seqs]
        greedy = [i for i, s in enumerate(seqs) if s.params.greedy]
        sampled = [i for i, s in enumerate(seqs) if not s.params.greedy]
        for group, verify in ((greedy, self._verify_greedy), (sampled, self._verify_sampled)):
            if not group:
                continue
            out = verify([seqs[i] for i in group], [drafts[i] for i in group], [logits[i] for i in group])
            self.counters.record([len(drafts[i]) for i in group], out.num_accepted)
            for i, tokens in zip(group, out.output_token_ids, strict=True):
                results[i] = tokens
        return results

    def _verify_greedy(
        self, seqs: list[Sequence], drafts: list[list[int]], logits: list[torch.Tensor]
    ) -> VerifyOutput:
        draft_ids, num_draft = pad_drafts(drafts, logits[0].device)
        return verify_greedy(_padded(logits, draft_ids.shape[1] + 1), draft_ids, num_draft)

    def _verify_sampled(
        self, seqs: list[Sequence], drafts: list[list[int]], logits: list[torch.Tensor]
    ) -> VerifyOutput:
        draft_ids, num_draft = pad_drafts(drafts, logits[0].device)
        width = draft_ids.shape[1]
        params = [s.params for s, rows in zip(seqs, logits, strict=True) for _ in range(rows.shape[0])]
        target = self._probs_fn(torch.cat(logits), params).split([rows.shape[0] for rows in logits])
        draft_probs = None
        if self.draft is not None:  # a model draft: q is the distribution each draft token was drawn from
            rows = [self._draft_probs[s.request_id][: len(d)] for s, d in zip(seqs, drafts, strict=True)]
            draft_probs = _padded(rows, width)
        generators = [self._generator_fn(s.request_id, s.params) for s in seqs]
        return rejection_sample(_padded(list(target), width + 1), draft_ids, num_draft, draft_probs, generators)
