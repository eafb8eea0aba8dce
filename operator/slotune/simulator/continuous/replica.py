"""One replica of a continuous simulation: the step model of `simulator.replica`, advanced to any time and fed
requests as they are routed to it, so its queue and its running batch carry over from one window to the next.

It adds a block-level prefix cache for replayed traces: a request's `prefix_block_ids` (512-token blocks, equal ids
equal content) hit when this replica prefilled them before, leading blocks only, as vLLM's hash chain matches. Cached
blocks live in the free pool, as in vLLM: they cost no memory until evicted, least recently used first, when the
running sequences need the room. A running sequence's hit blocks count in its memory (shared blocks of sequences
running at once are counted once each: an overestimate that errs toward preemption).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from slotune.knobs import RuntimeConfig
from slotune.perfmodel.roofline import StepTimeModel
from slotune.simulator.replica import ReplicaSimulator, SpeculationModel, _Seq
from slotune.workload import PlannedRequest

BLOCK_TOKENS = 512


@dataclass(frozen=True)
class ReplicaCounters:
    """Running totals of one replica, diffed at window boundaries."""

    num_records: int
    num_failed: int
    busy_s: float
    running_seq_s: float
    waiting_seq_s: float
    kv_token_s: float
    num_preemptions: int
    prefix_query_tokens: int
    prefix_hit_tokens: int


class TraceReplica(ReplicaSimulator):
    """A replica that lives through the whole trace: `enqueue` at arrival, `advance_to` any time."""

    def __init__(self, config: RuntimeConfig, step_model: StepTimeModel, kv_capacity_tokens: int,
                 speculation: SpeculationModel, draft_cost_s: float, now_s: float, record_itl: bool = True) -> None:
        super().__init__(config, step_model, kv_capacity_tokens, speculation, draft_cost_s)
        self.now_s = now_s
        self.record_itl = record_itl  # off: no inter-token histogram (a third of the step's bookkeeping)
        self.blocks: OrderedDict[int, None] = OrderedDict()  # cached prompt blocks, least recently used first

    @property
    def num_outstanding(self) -> int:
        return len(self.waiting) + len(self.running)

    def enqueue(self, request: PlannedRequest) -> None:
        self.waiting.append(_Seq(request, request.prompt_tokens))

    def advance_to(self, until_s: float) -> None:
        """Serve until `until_s` (the step in progress then may end a little after it, as a real step would)."""
        while self.now_s < until_s:
            if not self.waiting and not self.running:
                self.now_s = until_s
                return
            self._advance(self._schedule(), until_s)

    def reconfigure(self, config: RuntimeConfig, step_model: StepTimeModel, kv_capacity_tokens: int,
                    speculation: SpeculationModel, draft_cost_s: float) -> None:
        """Knobs changed live (the builtin runtime's /admin/config): the batch in flight carries on under them."""
        self.config, self.step_model, self.capacity = config, step_model, kv_capacity_tokens
        self.spec, self.draft_cost_s = speculation, draft_cost_s
        if not config.enable_prefix_caching:
            self.blocks.clear()
            self.cached_groups.clear()

    def counters(self) -> ReplicaCounters:
        return ReplicaCounters(len(self.records), self.num_failed, self.busy_s, self.running_seq_s,
                               self.waiting_seq_s, self.kv_token_s, self.num_preemptions, self.prefix_queries,
                               self.prefix_hits)

    def _record_gap(self, gap_s: float, count: int) -> None:
        if self.record_itl:
            super()._record_gap(gap_s, count)

    # -- the block prefix cache -------------------------------------------------------------------------------------

    def _kv_used(self) -> float:
        private = sum(s.kv_tokens + (s.cached if s.request.prefix_block_ids else 0) for s in self.running)
        return private + sum(self.cached_groups.values())

    def _cached_tokens(self, seq: _Seq) -> int:
        ids = seq.request.prefix_block_ids
        if not ids:
            return super()._cached_tokens(seq)
        if not self.config.enable_prefix_caching:
            return 0
        hits = 0
        for block in ids:
            if block not in self.blocks:
                break
            self.blocks.move_to_end(block)
            hits += 1
        # vLLM recomputes at least the prompt's last token, so a full hit still schedules one.
        return min(hits * BLOCK_TOKENS, seq.target_tokens - 1)

    def _prefilled(self, seq: _Seq, chunk: int) -> None:
        super()._prefilled(seq, chunk)
        ids = seq.request.prefix_block_ids
        if seq.in_prefill or not ids or not self.config.enable_prefix_caching:
            return
        for block in ids:
            self.blocks[block] = None
            self.blocks.move_to_end(block)
        room_blocks = max(0, int((self.capacity - self._kv_used()) // BLOCK_TOKENS))
        while len(self.blocks) > room_blocks:
            self.blocks.popitem(last=False)
