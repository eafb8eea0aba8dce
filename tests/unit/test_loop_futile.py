"""A change kept on a window that met, after a baseline window that missed, is judged again on its next missed window
(slotune.policy.futile). The tuner benchmark's summarization-h100-interactive: at every allowed replica TTFT P99
alternated between windows that met and bursts that missed; each token-budget step met once, was kept, and missed
the next window as before, and the loop walked the knob 256 -> 8192 and called the SLO infeasible after 8 changes."""

from __future__ import annotations

from slotune.api.status import Phase, Verdict
from slotune.api.tuning import Knob, KnobBounds, TuningSpec
from slotune.knobs import RuntimeConfig, SpeculativeConfig, SpeculativeMethod
from slotune.loop import MemoryStateStore, Tuner, TuningProblem, TuningState
from slotune.loop.state import PendingChange
from slotune.perfmodel import Deployment
from slotune.policy import PolicyInput
from slotune.policy.sizing import admissible, move_direction
from slotune.snapshot import LatencyMetric
from tests.unit.test_loop_drain import SLO, Replicas, _window

SMALL = RuntimeConfig(max_num_seqs=64, max_num_batched_tokens=256, replicas=4)
LARGER = SMALL.with_changes(max_num_batched_tokens=512)
MISSED = _window(1300.0, 0.2, 0)  # TTFT P99 ~2.6 s against 1,000 ms: the baseline's burst
MET = _window(300.0, 0.0, 1)


def _verifying(windows: list, max_replicas: int = 4) -> Tuner:
    """256 -> 512 applied against a missed baseline; the token budget the only knob."""
    backend = Replicas(windows)
    tuning = TuningSpec(cooldown_s=0, min_samples=10, knobs=[Knob.MAX_NUM_BATCHED_TOKENS],
                        bounds=KnobBounds(max_replicas=max_replicas))
    problem = TuningProblem(SLO, tuning, Deployment.from_names("llama-3.1-8b", "h100"), SMALL)
    pending = PendingChange(config=LARGER, previous=SMALL, knob=Knob.MAX_NUM_BATCHED_TOKENS,
                            change="max_num_batched_tokens 256 -> 512", reason="prefill", applied=True,
                            target_metric=LatencyMetric.TTFT, target_percentile=99)
    store = MemoryStateStore()
    store.save(TuningState(phase=Phase.VERIFYING, current=SMALL, pending=pending, baseline=MISSED, changes_applied=1,
                           tried_keys=frozenset({SMALL.key(), LARGER.key()})))
    backend.apply(LARGER)
    return Tuner(problem, backend, backend, store)


def test_a_kept_change_whose_next_window_misses_as_before_is_futile_and_named() -> None:
    tuner = _verifying([MET, _window(1300.0, 0.2, 2), MET, _window(1300.0, 0.2, 3)])
    state = tuner.step()
    assert state.history[-1].verdict is Verdict.KEPT and state.current == LARGER
    assert state.lucky is not None and state.lucky.move == "max_num_batched_tokens up"
    state = tuner.step()  # misses as the baseline did: the budget did not move the windows that miss
    assert state.futile_moves == ("max_num_batched_tokens up",), state.message
    assert "does not move the windows that miss" in state.history[-1].detail  # the kept change's entry says so
    while not state.at_rest:  # a further budget step would ask for a window this backend does not have
        state = tuner.step()
    assert state.phase is Phase.INFEASIBLE, state.message
    assert state.current == LARGER and state.changes_applied == 1  # no further budget step was tried
    assert state.infeasible is not None and "max_num_batched_tokens up measured not to move" in state.infeasible.reason


def test_a_kept_change_whose_next_miss_is_far_smaller_is_not_futile() -> None:
    tuner = _verifying([MET, _window(560.0, 0.1, 2)])  # ~1.1 s: still a miss, less than half the baseline's
    tuner.step()
    state = tuner.step()
    assert state.futile_moves == (), state.message


def test_below_max_replicas_a_miss_after_a_kept_change_leaves_the_knob_to_the_policy() -> None:
    tuner = _verifying([MET, _window(1300.0, 0.2, 2)], max_replicas=8)
    state = tuner.step()
    assert state.lucky is None
    state = tuner.step()
    assert state.futile_moves == (), state.message


def test_a_futile_move_blocks_that_knob_one_way_only() -> None:
    # A larger budget did nothing for TTFT's misses; a smaller one may still be TPOT's fix.
    given = PolicyInput(LARGER, MET, SLO, TuningSpec(knobs=[Knob.MAX_NUM_BATCHED_TOKENS, Knob.SPECULATIVE]),
                        Deployment.from_names("llama-3.1-8b", "h100"),
                        futile_moves=frozenset({"max_num_batched_tokens up", "speculative on"}))
    assert not admissible(LARGER.with_changes(max_num_batched_tokens=2048), Knob.MAX_NUM_BATCHED_TOKENS, given)
    assert admissible(SMALL.with_changes(max_num_batched_tokens=384), Knob.MAX_NUM_BATCHED_TOKENS, given)
    drafts = LARGER.with_changes(speculative=SpeculativeConfig(method=SpeculativeMethod.NGRAM,
                                                               num_speculative_tokens=4).model_dump())
    assert move_direction(LARGER, drafts, Knob.SPECULATIVE) == "speculative on"
    assert move_direction(drafts, LARGER, Knob.SPECULATIVE) == "speculative off"
    assert not admissible(drafts, Knob.SPECULATIVE, given)
