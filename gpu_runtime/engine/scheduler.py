"""Continuous-batching scheduler, vLLM V1 style: one rule for prefill and decode. Each step gives every sequence
the tokens it still needs (num_tokens - num_computed_tokens), running sequences first, then waiting ones in FCFS
order, within a token budget (max_num_batched_tokens) and max_num_seqs. A prompt larger than the remaining budget is
chunked when chunked prefill is on. When the KV pool runs out, the most recently admitted running sequence is
preempted (its blocks freed, recomputed later). Pure Python (no torch).

The scheduler is the only owner of KV blocks, speculative drafts included: a decoding sequence may ask for lookahead
slots (`num_lookahead`, e.g. its n-gram drafts, or the k tokens a draft model will write), which are scheduled and
allocated after its decode token when the budget and the free blocks allow (drafts never preempt anyone), and rolled
back to the accepted tokens in on_step_done. The speculative decoder only reads the block tables it is handed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gpu_runtime.config import SchedulerKnobs
from gpu_runtime.engine.block_manager import BlockManager
from gpu_runtime.engine.sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class ScheduledSequence:
    """seq computes tokens [start, start + num_new_tokens) of seq.token_ids + seq.spec_token_ids this step;
    the last num_spec_tokens of them are drafts to verify (speculative decoding)."""

    seq: Sequence
    start: int
    num_new_tokens: int
    num_spec_tokens: int = 0

    @property
    def completes(self) -> bool:
        """True when the step reaches the sequence's last token, so it yields logits for a new token."""
        return self.start + self.num_new_tokens - self.num_spec_tokens == self.seq.num_tokens


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: tuple[ScheduledSequence, ...]
    preempted: tuple[Sequence, ...]

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


# How many lookahead (draft) slots a running sequence wants after its uncomputed tokens this step.
LookaheadFn = Callable[[Sequence], int]


def drafted_tokens(seq: Sequence) -> int:
    """The default lookahead: the drafts already proposed for the sequence (n-gram lookup runs before scheduling)."""
    return len(seq.spec_token_ids)


class Scheduler:
    def __init__(self, knobs: SchedulerKnobs, block_manager: BlockManager) -> None:
        self.knobs = knobs
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def set_knobs(self, knobs: SchedulerKnobs) -> None:
        """Takes effect at the next schedule(); running sequences above a lowered max_num_seqs finish normally."""
        self.knobs = knobs
        self.block_manager.enable_prefix_caching = knobs.enable_prefix_caching

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out of the queues and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq.request_id)
        seq.status = SequenceStatus.FINISHED

    def schedule(self, num_lookahead: LookaheadFn = drafted_tokens) -> SchedulerOutput:
        budget = self.knobs.max_num_batched_tokens
        scheduled, preempted = self._schedule_running(budget, num_lookahead)
        budget -= sum(s.num_new_tokens for s in scheduled)
        if not preempted:
            scheduled += self._schedule_waiting(budget, nothing_scheduled=not scheduled)
        return SchedulerOutput(tuple(scheduled), tuple(preempted))

    def _schedule_running(
        self, budget: int, num_lookahead: LookaheadFn
    ) -> tuple[list[ScheduledSequence], list[Sequence]]:
        scheduled: list[ScheduledSequence] = []
        preempted: list[Sequence] = []
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = self._num_new_tokens(seq, budget, num_lookahead(seq))
            while not self.block_manager.allocate(seq.request_id, seq.num_computed_tokens + num_new):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                num_spec = max(0, seq.num_computed_tokens + num_new - seq.num_tokens)  # drafts that fit the budget
                scheduled.append(ScheduledSequence(seq, seq.num_computed_tokens, num_new, num_spec))
                budget -= num_new
                i += 1
        return scheduled, preempted

    def _num_new_tokens(self, seq: Sequence, budget: int, num_lookahead: int) -> int:
        """The uncomputed tokens plus the lookahead slots that fit the budget, or without lookahead when the free
        blocks cannot hold it: a draft is worth a slot, never another sequence's preemption."""
        num_needed = seq.num_tokens - seq.num_computed_tokens
        with_lookahead = min(num_needed + num_lookahead, budget)
        total = seq.num_computed_tokens + with_lookahead
        if with_lookahead > num_needed and not self.block_manager.can_allocate(seq.request_id, total):
            return min(num_needed, budget)
        return with_lookahead

    def _schedule_waiting(self, budget: int, nothing_scheduled: bool) -> list[ScheduledSequence]:
        scheduled: list[ScheduledSequence] = []
        while self.waiting and budget > 0 and len(self.running) < self.knobs.max_num_seqs:
            seq = self.waiting[0]
            prefix = self.block_manager.find_cached_prefix(seq.token_ids)
            num_new = seq.num_tokens - prefix.num_tokens
            if num_new > budget and not self.knobs.enable_chunked_prefill:
                # Without chunking a prompt must fit whole; one larger than the entire budget runs alone rather
                # than never (vLLM refuses such configs instead).
                if scheduled or not nothing_scheduled:
                    break
            else:
                num_new = min(num_new, budget)
            total = prefix.num_tokens + num_new
            if not self.block_manager.allocate(seq.request_id, total, prefix, num_query_tokens=seq.num_tokens):
                break
            self.waiting.popleft()
            self._admit(seq, prefix.num_tokens)
            scheduled.append(ScheduledSequence(seq, prefix.num_tokens, num_new))
            budget -= num_new
        return scheduled

    def _admit(self, seq: Sequence, num_cached_tokens: int) -> None:
        seq.status = SequenceStatus.RUNNING
        seq.num_computed_tokens = num_cached_tokens
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = num_cached_tokens
        self.running.append(seq)

    def _preempt(self, seq: Sequence) -> None:
        """Preemption by recompute: drop the KV, keep the tokens, requeue at the front."""
        self.block_manager.free(seq.request_id)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def on_step_done(self, output: SchedulerOutput) -> None:
        """Advance computed counts after the forward pass and publish newly full blocks to the prefix cache.

        A sequence that verified drafts must already hold its new tokens: its KV is valid up to (not including) its
        last token, so rejected drafts' positions are rolled back and their blocks returned.
        """
        bm = self.block_manager
        for item in output.scheduled:
            seq = item.seq
            seq.num_computed_tokens = item.start + item.num_new_tokens
            if item.num_spec_tokens:
                seq.num_computed_tokens = min(seq.num_computed_tokens, seq.num_tokens - 1)
                bm.truncate(seq.request_id, seq.num_computed_tokens)
            bm.cache_full_blocks(seq.request_id, seq.token_ids, seq.num_computed_tokens)
