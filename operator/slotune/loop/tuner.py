"""The tuning loop, written once: measure -> diagnose -> decide -> apply or verify -> keep or roll back -> persist.

One `Tuner.step()` judges one measurement window. State is loaded from and saved to the `StateStore` around every
side effect, and a decided change is saved as an intent before the backend applies it, so a process killed at any
point resumes where it stopped. A step never waits: a rollout still in progress or a window still open ends the step
with the state saved, and `wake_at_s` says when stepping again is worth it. `tuning.mode: off` runs the same step and
only reports.

The loop is the state machine and nothing else; every rule that chooses or rejects a change is the policy's
(slotune.policy) and every verdict the judge's (slotune.judge). Its steps, one module each, each building on the one
before: apply (`loop.apply`: intents, rollouts, rollbacks), measure (`loop.measure`: the window, its calibration
and diagnosis), converge (`loop.converge`: confirm with confidence, or ask the policy), verify (`loop.verify`: the
pending change's verdict), reopen (`loop.reopen`: a workload shift or spec change at rest). Before any of them sees
a window, capacity control (`loop.capacity`) sizes replicas for it, every window and in every phase; the search
judges only the windows it calls steady. `Tuner` composes them.
"""

from __future__ import annotations

from slotune.api.status import Phase
from slotune.api.tuning import TuningMode
from slotune.loop import canary as loop_canary
from slotune.loop.reopen import ReopenStep
from slotune.loop.state import TuningState
from slotune.loop.verify import VerifyStep
from slotune.snapshot import MetricsSnapshot


class Tuner(VerifyStep, ReopenStep):
    def step(self) -> TuningState:
        """Judge one window (or advance a rollout, or finish an interrupted apply). Returns the saved state."""
        self.wake_at_s, self._ignored = None, ""
        state = self.store.load() or self._start()
        if state.rollout is not None:
            state = self._await_rollout(state)
            if state.rollout is not None or state.phase is Phase.DEGRADED:
                return state
        if state.phase in (Phase.INFEASIBLE, Phase.DEGRADED) and state.pending is None:
            return self._reopen_if_changed(state)
        if state.pending is not None and not state.pending.applied and not state.pending.rebaseline:
            return self._save(self._apply_pending(state))
        if (quality := loop_canary.quality_first(self.quality, state.pending)) is not None:
            return self._canary_quality(state, quality)  # judged on the canary pod before any latency window
        if self.clock() < state.cooldown_until_s:
            self.wake_at_s = state.cooldown_until_s
            return state
        snapshot = self._window(state)
        if isinstance(snapshot, TuningState):
            return snapshot
        state, steady = self._control_capacity(state, snapshot)
        if not steady:
            return self._save(state)
        snapshot, state = self._pool_short(state, snapshot)
        if snapshot.num_requests < self.problem.tuning.min_samples:
            return self._save(self._too_short(state, snapshot))
        return self._save(self._judge_window(self._measured(state, snapshot), snapshot))

    def run(self, max_windows: int) -> TuningState:
        """Step until Converged with nothing left to save, Infeasible or Degraded, or `max_windows` windows."""
        state = self.store.load() or self._start()
        for _ in range(max_windows):
            state = self.step()
            if state.at_rest:
                break
        return state

    def _judge_window(self, state: TuningState, snapshot: MetricsSnapshot) -> TuningState:
        """A measured window: reported only (tuning off), the fresh baseline of a rebaseline, the pending change's
        verdict, or (nothing pending, or a change just kept) judged for convergence or the next change."""
        if self.problem.tuning.mode is TuningMode.OFF:
            return state.evolve(phase=Phase.MEASURING, message="tuning off: reporting only")
        if state.pending is not None and state.pending.rebaseline:  # the kept config's fresh baseline (rebaseline)
            return self._rebaselined(state, snapshot)
        state = state.evolve(noise_floor=loop_canary.observe_noise(self.source, state, self.problem.slo))
        state = self._watch_load(state, snapshot)
        if state.pending is not None:
            state, kept = self._verify(state, snapshot)
            if not kept:
                return state
        return self._judge(state, snapshot)
