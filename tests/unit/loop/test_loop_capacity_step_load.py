"""A replica added while the SLO missed is not judged on windows whose loads differ several-fold: their latencies
measure the load, not the step (slotune.policy.keep). In the tuner benchmark's bursty code worlds (arrival CV 13),
one window ran at 0.8 requests/s and the next at 9/s, and replicas that narrowed the miss noise-free on the same
traffic were rolled back. Where the loads compare, a replica that does not help is still rolled back."""

from __future__ import annotations

from dataclasses import replace

from slotune.api.status import Verdict
from slotune.policy.keep import LOAD_APART
from tests.unit.loop.test_loop_drain import _tuner, _window


def _at(ttft_ms: float, rate: float, seed: int):
    return replace(_window(ttft_ms, 0.2, seed), request_rate_per_s=rate)


def _verdicts(after: list, baseline_rate: float = 9.0) -> tuple[list, list]:
    tuner, replicas = _tuner(after)
    state = tuner.store.load()
    assert state is not None
    tuner.store.save(state.evolve(baseline=_at(3000.0, baseline_rate, 0)))
    states = [tuner.step() for _ in range(len(after) + 1)]
    return states, replicas.applied


def test_a_replica_judged_on_a_window_of_another_load_gets_one_more_then_is_kept() -> None:
    # After 1 -> 2 the windows carry a tenth of the baseline's load (a lull inside a bursty trace) and their TTFT P99
    # sits where the baseline's was: no improvement beyond noise, which that load cannot show either way.
    rate = 9.0 / (2 * LOAD_APART)
    states, applied = _verdicts([_at(2950.0, rate, 1), _at(3000.0, rate, 2)])
    assert "measuring one more window" in states[1].message and "apart" in states[1].message
    (entry,) = [h for h in states[2].history if h.verdict in (Verdict.KEPT, Verdict.ROLLED_BACK)]
    assert entry.verdict is Verdict.KEPT and "kept as capacity" in entry.detail + entry.change + states[2].message
    assert applied[-1].replicas == 2


def test_a_replica_that_does_not_help_at_the_same_load_is_rolled_back() -> None:
    states, _ = _verdicts([_at(3050.0, 9.0, 1)])
    (entry,) = [h for h in states[1].history if h.verdict in (Verdict.KEPT, Verdict.ROLLED_BACK)]
    assert entry.verdict is Verdict.ROLLED_BACK and entry.config is not None and entry.config.replicas == 2
