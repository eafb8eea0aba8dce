"""One simulated serving replica: a continuous-batching scheduler driven by the roofline step time.

It follows vLLM's scheduler closely enough to reproduce the knobs' effects: at most `max_num_seqs` running sequences
and `max_num_batched_tokens` tokens per step; with chunked prefill, decodes go first and prompts fill the rest of the
budget in chunks (mixed steps); without it, waiting prompts run whole in prefill-only steps that stall every decode
(the interference chunked prefill removes). KV cache capacity bounds admission; when decodes outgrow it the newest
sequence is preempted and later recomputed. Prefix caching reuses a prefix group's tokens once a prompt of that group
has been prefilled on this replica. Speculative decoding verifies k+1 tokens per sequence per step and advances by
the expected accepted length (1 - a^(k+1)) / (1 - a) (Leviathan et al. 2023, eq. 1) for per-token acceptance a.
Stretches of identical decode steps between events are advanced in one go, so a window costs O(events), not O(tokens).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from slotune.knobs import RuntimeConfig
from slotune.perfmodel.roofline import StepShape, StepTimeModel
from slotune.workload import PlannedRequest


@dataclass(frozen=True)
class SimulatedRequest:
    """The timeline of one simulated request, in seconds since the window started."""

    arrival_s: float
    first_scheduled_s: float
    first_token_s: float
    finish_s: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class ReplicaResult:
    records: tuple[SimulatedRequest, ...]
    num_failed: int
    itl_gaps_s: tuple[tuple[float, int], ...]  # (gap, number of output events with that gap)
    busy_s: float
    running_seq_s: float  # integral of running sequences over time
    waiting_seq_s: float
    kv_token_s: float  # integral of KV tokens in use over time
    kv_capacity_tokens: int
    num_preemptions: int
    prefix_query_tokens: int
    prefix_hit_tokens: int


@dataclass
class _Seq:
    request: PlannedRequest
    target_tokens: int  # tokens to prefill: the prompt, plus generated tokens after a preemption
    computed: int = 0
    generated: float = 0.0
    cached: int = 0
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    last_event_s: float = 0.0  # time of its latest output token, for inter-token gaps

    @property
    def in_prefill(self) -> bool:
        return self.computed < self.target_tokens

    @property
    def kv_tokens(self) -> float:
        """Private KV tokens (shared prefix blocks are counted once, by the replica)."""
        return self.computed - self.cached + (self.generated if not self.in_prefill else 0.0)


@dataclass
class _Step:
    prefill: list[tuple[_Seq, int]] = field(default_factory=list)
    decode: list[_Seq] = field(default_factory=list)


@dataclass(frozen=True)
class SpeculationModel:
    """Per-sequence tokens verified per step and the expected tokens produced."""

    verified_tokens: int = 1
    expected_tokens: float = 1.0

    @classmethod
    def for_config(cls, config: RuntimeConfig, acceptance_rate: float) -> SpeculationModel:
        if config.speculative is None:
            return cls()
        k, a = config.speculative.num_speculative_tokens, min(acceptance_rate, 0.999)
        return cls(k + 1, (1 - a ** (k + 1)) / (1 - a))


class ReplicaSimulator:
    """Simulates one replica serving `requests` (arrival order) under `config`."""

    def __init__(self, config: RuntimeConfig, step_model: StepTimeModel, kv_capacity_tokens: int,
                 speculation: SpeculationModel, draft_cost_s: float = 0.0) -> None:
        self.config, self.step_model, self.capacity = config, step_model, kv_capacity_tokens
        self.spec, self.draft_cost_s = speculation, draft_cost_s
        self.now_s = 0.0
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self.cached_groups: dict[int, int] = {}  # prefix group -> cached tokens
        self.records: list[SimulatedRequest] = []
        self.itl: dict[float, int] = {}
        self.num_failed = self.num_preemptions = self.prefix_queries = self.prefix_hits = 0
        self.busy_s = self.running_seq_s = self.waiting_seq_s = self.kv_token_s = 0.0

    def run(self, requests: list[PlannedRequest]) -> ReplicaResult:
        pending = deque(requests)
        while pending or self.waiting or self.running:
            while pending and pending[0].arrival_s <= self.now_s:
                request = pending.popleft()
                self.waiting.append(_Seq(request, request.prompt_tokens))
            if not self.waiting and not self.running:
                self.now_s = pending[0].arrival_s
                continue
            next_arrival_s = pending[0].arrival_s if pending else math.inf
            self._advance(self._schedule(), next_arrival_s)
        return ReplicaResult(tuple(self.records), self.num_failed, tuple(sorted(self.itl.items())), self.busy_s,
                             self.running_seq_s, self.waiting_seq_s, self.kv_token_s, self.capacity,
                             self.num_preemptions, self.prefix_queries, self.prefix_hits)

    # -- scheduling ---------------------------------------------------------------------------------------------

    def _kv_used(self) -> float:
        return sum(s.kv_tokens for s in self.running) + sum(self.cached_groups.values())

    def _schedule(self) -> _Step:
        step = _Step()
        budget = self.config.max_num_batched_tokens
        if self.config.enable_chunked_prefill or not self.waiting or len(self.running) >= self.config.max_num_seqs:
            step.decode = self._reserve_decodes()
            budget -= len(step.decode) * self.spec.verified_tokens
            if not self.config.enable_chunked_prefill and step.decode:
                return step
        for seq in self.running:
            if seq.in_prefill and budget > 0:
                chunk = self._chunk(seq, budget, step)
                if chunk:
                    step.prefill.append((seq, chunk))
                    budget -= chunk
        self._admit(step, budget)
        if not step.prefill and not step.decode:
            step.decode = self._reserve_decodes()
        return step

    def _chunk(self, seq: _Seq, budget: int, step: _Step) -> int:
        remaining = seq.target_tokens - seq.computed
        if self.config.enable_chunked_prefill:
            return min(remaining, budget)
        # Without chunking a prompt runs whole; one longer than the budget runs alone in its own step.
        alone = not step.prefill and not step.decode and budget == self.config.max_num_batched_tokens
        return remaining if remaining <= budget or alone else 0

    def _admit(self, step: _Step, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            cached = self._cached_tokens(seq)
            need = seq.target_tokens - cached + 1
            if need > self.capacity:
                self.waiting.popleft()
                self.num_failed += 1  # can never fit: the runtime rejects it
                continue
            if self._kv_used() + need > self.capacity:
                if self.running or not self.cached_groups:
                    return
                self.cached_groups.clear()  # an idle replica evicts cached prefixes before refusing work
            seq.cached = seq.computed = cached
            chunk = self._chunk(seq, budget, step)
            if chunk == 0:
                return
            self.waiting.popleft()
            if seq.first_scheduled_s is None:
                seq.first_scheduled_s = self.now_s
                self.prefix_queries += seq.request.prompt_tokens
                self.prefix_hits += cached
            self.running.append(seq)
            step.prefill.append((seq, chunk))
            budget -= chunk

    def _cached_tokens(self, seq: _Seq) -> int:
        group = seq.request.prefix_group
        if not self.config.enable_prefix_caching or group is None:
            return 0
        return self.cached_groups.get(group, 0)

    def _reserve_decodes(self) -> list[_Seq]:
        """Decoding sequences, after preempting the newest ones until this step's new tokens fit in the KV cache."""
        while True:
            decodes = [s for s in self.running if not s.in_prefill]
            if self._kv_used() + len(decodes) * self.spec.expected_tokens <= self.capacity or len(self.running) <= 1:
                return decodes
            self._preempt(self.running[-1])

    def _preempt(self, seq: _Seq) -> None:
        self.running.remove(seq)
        seq.target_tokens = seq.request.prompt_tokens + int(seq.generated)
        seq.computed = seq.cached = 0
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    # -- time -----------------------------------------------------------------------------------------------------

    def _advance(self, step: _Step, next_arrival_s: float) -> None:
        shape = self._shape(step)
        step_s = self.step_model.step_time_s(shape) + (self.draft_cost_s if step.decode else 0.0)
        repeats = self._repeats(step, step_s, next_arrival_s)
        if repeats > 1:  # context grows during the stretch: price it at its midpoint
            growth = len(step.decode) * self.spec.expected_tokens * (repeats - 1) / 2
            shape = StepShape(0, 0.0, shape.num_decode_seqs, shape.decode_context_tokens + growth,
                              shape.tokens_per_decode_seq)
            step_s = self.step_model.step_time_s(shape) + self.draft_cost_s
        self._account(step_s * repeats)
        first_event_s = self.now_s + step_s
        self.now_s += step_s * repeats
        for seq in step.decode:
            # The first gap includes any stall since its last token (a prefill-only step in between).
            self._record_gap(first_event_s - seq.last_event_s, 1)
            self._record_gap(step_s, repeats - 1)
            seq.last_event_s = self.now_s
            seq.generated = min(seq.generated + self.spec.expected_tokens * repeats, seq.request.output_tokens)
        for seq, chunk in step.prefill:
            self._prefilled(seq, chunk)
        self._finish_done()

    def _record_gap(self, gap_s: float, count: int) -> None:
        if count > 0:
            key = round(gap_s, 5)
            self.itl[key] = self.itl.get(key, 0) + count

    def _shape(self, step: _Step) -> StepShape:
        attention = sum(c * (s.computed + c / 2) for s, c in step.prefill)
        context = sum(s.computed + s.generated for s in step.decode)
        return StepShape(sum(c for _, c in step.prefill), attention, len(step.decode), context,
                         self.spec.verified_tokens, len(step.prefill), sum(c * s.computed for s, c in step.prefill),
                         sum(1 for s, _ in step.prefill if s.computed == s.cached))

    def _repeats(self, step: _Step, step_s: float, next_arrival_s: float) -> int:
        """How many identical decode-only steps can run before anything else could change."""
        if step.prefill or not step.decode or any(s.in_prefill for s in self.running):
            return 1
        if self.waiting and len(self.running) < self.config.max_num_seqs:
            return 1  # admission might succeed as soon as memory frees up
        to_finish = min(math.ceil((s.request.output_tokens - s.generated) / self.spec.expected_tokens)
                        for s in step.decode)
        headroom = self.capacity - self._kv_used()
        to_full = int(headroom / (len(step.decode) * self.spec.expected_tokens))
        to_arrival = math.ceil((next_arrival_s - self.now_s) / step_s) if next_arrival_s < math.inf else to_finish
        return max(1, min(to_finish, to_full, to_arrival))

    def _account(self, elapsed_s: float) -> None:
        self.busy_s += elapsed_s
        self.running_seq_s += len(self.running) * elapsed_s
        self.waiting_seq_s += len(self.waiting) * elapsed_s
        self.kv_token_s += self._kv_used() * elapsed_s

    def _prefilled(self, seq: _Seq, chunk: int) -> None:
        seq.computed += chunk
        if seq.in_prefill:
            return
        seq.generated += 1  # the prefill step samples the next token
        seq.last_event_s = self.now_s
        if seq.first_token_s is None:
            seq.first_token_s = self.now_s
        group = seq.request.prefix_group
        if self.config.enable_prefix_caching and group is not None:
            self.cached_groups[group] = seq.request.shared_prefix_tokens

    def _finish_done(self) -> None:
        for seq in [s for s in self.running if not s.in_prefill and s.generated >= s.request.output_tokens]:
            self.running.remove(seq)
            r = seq.request
            assert seq.first_scheduled_s is not None and seq.first_token_s is not None
            self.records.append(SimulatedRequest(r.arrival_s, seq.first_scheduled_s, seq.first_token_s, self.now_s,
                                              r.prompt_tokens, r.output_tokens, seq.cached))
