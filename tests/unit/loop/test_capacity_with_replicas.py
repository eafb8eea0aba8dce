"""Capacity control owns the replica count: every config the loop state names follows it, the candidate under
verification included. A candidate left at the count it was proposed with is applied at that count by the search,
undoing capacity control's step every other window (seen on the Azure trace on an L4: 42.7 changes an hour)."""

from __future__ import annotations

from slotune.api.status import Phase
from slotune.api.tuning import Knob
from slotune.knobs import RuntimeConfig
from slotune.loop import TuningState
from slotune.loop.capacity import with_replicas
from slotune.loop.state import PendingChange
from slotune.snapshot import LatencyMetric

FIVE = RuntimeConfig(max_num_batched_tokens=2048, replicas=5)
CANDIDATE = FIVE.with_changes(max_num_batched_tokens=256)


def test_every_config_of_the_state_follows_the_replica_count_the_candidate_included() -> None:
    pending = PendingChange(config=CANDIDATE, previous=FIVE, knob=Knob.MAX_NUM_BATCHED_TOKENS,
                            change="max_num_batched_tokens 2048 -> 256", reason="prefill interference",
                            target_metric=LatencyMetric.TPOT, target_percentile=99)
    state = with_replicas(TuningState(phase=Phase.VERIFYING, current=CANDIDATE, pending=pending), 8)
    assert state.pending is not None
    assert state.pending.config.replicas == 8  # what the search applies when it re-applies the candidate
    assert state.pending.config.max_num_batched_tokens == 256  # the engine knobs stay the search's
    assert state.pending.previous.replicas == 8  # what a rollback restores
    assert state.current.replicas == 8
