"""The tuning loop end to end, with the simulator (our own real component) as deployment and measurement source."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from slotune.api.status import Phase, Verdict
from slotune.api.tuning import Knob, KnobBounds, TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.loop import (
    ApplyResult,
    FileStateStore,
    MemoryStateStore,
    MetricsUnavailable,
    Tuner,
    TuningProblem,
    TuningState,
)
from slotune.loop.state import HistoryRecord, PendingChange, now_utc
from slotune.metrics.window import UnavailableReason
from slotune.perfmodel import Deployment
from slotune.simulator.backend import SimulatedDeployment
from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric, MetricsSnapshot
from slotune.workload import LengthDistribution, Profile, WorkloadSpec

H100 = Deployment.from_names("llama-3.1-8b", "h100")
L4 = Deployment.from_names("llama-3.1-8b", "l4")
CHAT = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=20)
RELAXED = SLOSpec.model_validate({"ttft": {"p99": 2000}, "tpot": {"p99": 100}})
TUNING = TuningSpec(cooldown_s=0, min_samples=50, max_iterations=8, bounds=KnobBounds(max_replicas=4))
POOR = RuntimeConfig(max_num_seqs=4, max_num_batched_tokens=512, enable_prefix_caching=False)


def _problem(deployment: Deployment = H100, slo: SLOSpec = RELAXED, workload: WorkloadSpec = CHAT,
             tuning: TuningSpec = TUNING, start: RuntimeConfig = POOR) -> TuningProblem:
    return TuningProblem(slo, tuning, deployment, start, workload)


def _world(deployment: Deployment = H100, workload: WorkloadSpec = CHAT, **kw: object) -> SimulatedDeployment:
    return SimulatedDeployment(deployment, workload, requests_per_window=120, **kw)  # type: ignore[arg-type]


def test_poor_start_converges_with_few_verified_changes():
    world = _world()
    state = Tuner(_problem(), world, world, MemoryStateStore()).run(max_windows=20)
    assert state.phase is Phase.CONVERGED
    assert state.measured.slo_met
    fixes = [h for h in state.history if not h.trim]
    assert 1 <= len(fixes) <= 3
    assert fixes[0].verdict is Verdict.KEPT
    assert state.changes_applied == len(state.history)  # trims after convergence are verified changes too
    assert world.running == state.current  # the loop's idea of the config is what runs
    assert state.current.max_num_seqs > POOR.max_num_seqs


def test_state_round_trips_through_json_with_its_samples():
    world = _world()
    store = MemoryStateStore()
    tuner = Tuner(_problem(), world, world, store)
    state = tuner.step()  # the baseline misses: a change is applied and awaits its window
    again = TuningState.from_json(state.to_json())
    assert again == state
    status = again.to_status()
    assert status.phase is state.phase and status.config == state.running
    # While a change is verified, the status shows the config serving (the change), not the one kept before it.
    assert state.pending is not None and state.pending.applied and status.config == state.pending.config


def test_resume_from_a_saved_state_mid_iteration(tmp_path):
    world = _world()
    path = tmp_path / "state.json"
    first = Tuner(_problem(), world, world, FileStateStore(path))
    state = first.step()  # baseline window judged, a change applied, now awaiting verification
    assert state.phase is Phase.VERIFYING and state.pending is not None and state.pending.applied
    # A new process (new tuner, new store object) picks up the file and verifies the pending change.
    resumed = Tuner(_problem(), world, world, FileStateStore(path))
    state = resumed.step()
    assert state.pending is None or state.pending.config != FileStateStore(path).load().current
    assert state.history[0].verdict in (Verdict.KEPT, Verdict.ROLLED_BACK)
    final = resumed.run(max_windows=20)
    assert final.phase is Phase.CONVERGED


@dataclass
class _DiesDuringApply:
    """Stands in for a process killed between saving an intent and the backend finishing the apply: a fault the
    real backend cannot be made to produce on demand, so this wrapper raises once."""

    inner: SimulatedDeployment
    armed: bool = True

    def apply(self, config: RuntimeConfig) -> ApplyResult:
        if self.armed and config != self.inner.running and self.inner.running is not None:
            self.armed = False
            raise KeyboardInterrupt("killed mid-apply")
        return self.inner.apply(config)

    def ready(self) -> bool:
        return self.inner.ready()


def test_an_intent_saved_before_a_crash_is_applied_on_resume(tmp_path):
    world = _world()
    path = tmp_path / "state.json"
    dying = _DiesDuringApply(world)
    with pytest.raises(KeyboardInterrupt):
        Tuner(_problem(), dying, world, FileStateStore(path)).step()
    saved = FileStateStore(path).load()
    assert saved is not None and saved.pending is not None and not saved.pending.applied
    assert world.running == POOR  # the change never reached the deployment
    state = Tuner(_problem(), world, world, FileStateStore(path)).step()
    assert state.pending is not None and state.pending.applied
    assert world.running == state.pending.config


@dataclass
class _Blackout:
    """Prometheus down for the first `windows` windows (a fault the simulator has no reason to produce)."""

    inner: SimulatedDeployment
    windows: int

    def measure(self, window_s: float) -> MetricsSnapshot:
        if self.windows > 0:
            self.windows -= 1
            raise MetricsUnavailable(UnavailableReason.UNREACHABLE, "connection refused")
        return self.inner.measure(window_s)


def test_metrics_unavailable_keeps_the_config_and_says_so():
    world = _world()
    tuner = Tuner(_problem(), world, _Blackout(world, windows=2), MemoryStateStore())
    for _ in range(2):
        state = tuner.step()
        assert not state.measured.metrics_available
        assert "metrics unavailable" in state.message
        assert state.changes_applied == 0 and state.current == POOR
    assert world.applied == [POOR]  # no thrashing: nothing applied while blind
    state = tuner.step()
    assert state.measured.metrics_available and state.changes_applied == 1


def test_a_config_that_crashes_is_rolled_back_and_never_retried():
    # The GPU is shared: the deployment really gets 73.5% of the L4's memory while the spec (and so the policy's
    # model) assumes 90%. A 2048-token budget then leaves too little KV cache for max_model_len and the runtime
    # refuses to start, as vLLM does after its memory profiling; 256..1024 still start.
    real = replace(L4, memory_utilization=0.735)
    prompts = WorkloadSpec(profile=Profile.CUSTOM, request_rate_per_s=0.5,
                           prompt_tokens=LengthDistribution(p50=1500, p99=1600),
                           output_tokens=LengthDistribution(p50=30, p99=40))
    slo = SLOSpec.model_validate({"ttft": {"p50": 380}})
    world = _world(real, prompts)
    tuning = TuningSpec(cooldown_s=0, min_samples=30, max_iterations=6, bounds=KnobBounds(max_replicas=1))
    start = RuntimeConfig(max_num_seqs=16, max_num_batched_tokens=256)
    state = Tuner(_problem(L4, slo, prompts, tuning, start), world, world, MemoryStateStore()).run(20)
    failed = [h for h in state.history if h.verdict is Verdict.FAILED]
    assert [h.config.max_num_batched_tokens for h in failed] == [2048]
    assert failed[0].config.key() in state.learned.failed_keys
    assert "KV cache" in failed[0].detail
    assert world.running == state.current and real.startup_error(state.current) is None
    assert state.phase is Phase.CONVERGED  # found a budget that starts and meets the target
    assert state.current.max_num_batched_tokens in (512, 1024)


def test_an_unreachable_tpot_ends_infeasible_with_the_closest_config_running():
    interactive = SLOSpec.model_validate({"ttft": {"p99": 500}, "tpot": {"p99": 30}})
    light = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=1)
    world = _world(L4, light)
    state = Tuner(_problem(L4, interactive, light), world, world, MemoryStateStore()).run(max_windows=20)
    assert state.phase is Phase.INFEASIBLE
    assert state.infeasible is not None and any("memory bandwidth" in need for need in state.infeasible.needs)
    assert world.running == state.infeasible.closest == state.current
    assert "infeasible" in state.message


def test_converged_does_not_flap_on_a_to_a_windows():
    world = _world()
    tuner = Tuner(_problem(start=RuntimeConfig(max_num_seqs=128)), world, world, MemoryStateStore())
    state = tuner.run(max_windows=10)
    assert state.phase is Phase.CONVERGED
    applied_before = len(world.applied)
    for _ in range(4):
        state = tuner.step()
    assert state.phase is Phase.CONVERGED
    assert len(world.applied) == applied_before  # same config, fresh windows: no change


def test_one_bad_window_after_convergence_does_not_retune_but_two_do():
    """The same load served slower (an L4's step times for a while): no workload shift, so hysteresis applies."""
    world = _world()
    tuner = Tuner(_problem(start=RuntimeConfig(max_num_seqs=128)), world, world, MemoryStateStore())
    assert tuner.run(max_windows=10).phase is Phase.CONVERGED
    world.deployment = L4
    state = tuner.step()
    assert state.phase is Phase.CONVERGED and state.convergence.windows_missed == 1
    state = tuner.step()
    assert state.phase in (Phase.VERIFYING, Phase.TUNING, Phase.INFEASIBLE)
    assert not any(h.verdict is Verdict.WORKLOAD_SHIFT for h in state.history)


def test_a_load_jump_after_convergence_is_a_workload_shift_acted_on_at_once():
    world = _world()
    tuner = Tuner(_problem(start=RuntimeConfig(max_num_seqs=128)), world, world, MemoryStateStore())
    assert tuner.run(max_windows=10).phase is Phase.CONVERGED
    world.workload = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=200)  # the load jumps 10x
    state = tuner.step()
    assert state.phase in (Phase.VERIFYING, Phase.TUNING, Phase.INFEASIBLE)
    shift = next(h for h in state.history if h.verdict is Verdict.WORKLOAD_SHIFT)
    assert "request rate" in shift.reason and "tuning resumes" in shift.detail


def test_max_iterations_reached_is_reported_with_the_best_config():
    tuning = TuningSpec(cooldown_s=0, min_samples=50, max_iterations=1, bounds=KnobBounds(max_replicas=4))
    heavy = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=60)
    world = _world(H100, heavy)
    state = Tuner(_problem(workload=heavy, tuning=tuning), world, world, MemoryStateStore()).run(max_windows=10)
    assert state.phase in (Phase.INFEASIBLE, Phase.CONVERGED)
    assert state.changes_applied <= 1
    if state.phase is Phase.INFEASIBLE:
        assert state.infeasible is not None and state.learned.best is not None


def test_converged_is_at_rest_only_once_no_cost_saving_change_is_left():
    state = TuningState.initial(POOR).evolve(phase=Phase.CONVERGED)
    assert not state.at_rest  # trims (fewer replicas, cheaper replicas) may follow
    assert state.evolve(settled=True).at_rest
    assert state.evolve(phase=Phase.INFEASIBLE).at_rest
    in_flight = PendingChange(config=POOR.with_changes(replicas=2), previous=POOR, knob=Knob.REPLICAS, change="x",
                              reason="y", target_metric=LatencyMetric.TTFT, target_percentile=99, trim=True)
    assert not state.evolve(settled=True, pending=in_flight).at_rest


def test_a_saving_is_kept_only_after_the_slo_held_over_two_windows():
    light = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=4)
    world = _world(workload=light)
    start = RuntimeConfig(max_num_seqs=64, replicas=4)
    tuner = Tuner(_problem(workload=light, start=start), world, world, MemoryStateStore())
    windows_while_pending: dict[str, int] = {}
    state = tuner.step()
    for _ in range(30):
        if state.at_rest:
            break
        before = state.pending.change if state.pending is not None and state.pending.applied else None
        state = tuner.step()
        if before is not None:
            windows_while_pending[before] = windows_while_pending.get(before, 0) + 1
    kept_trims = [h for h in state.history if h.trim and h.verdict is Verdict.KEPT]
    assert kept_trims and state.current.replicas < 4
    assert all(windows_while_pending[h.change] >= 2 for h in kept_trims)


def test_an_inconclusive_improvement_gets_one_more_window_then_a_verdict():
    # A small batch step on a moderately loaded replica: TTFT P99 moves, but one window cannot prove it.
    world = _world()
    tuner = Tuner(_problem(start=RuntimeConfig(max_num_seqs=24)), world, world, MemoryStateStore())
    state = tuner.step()
    seen_extra = False
    for _ in range(20):
        state = tuner.step()
        if state.measured.first_after is not None:
            seen_extra = True
            assert state.pending is not None and "one more window" in state.message
            resolved = tuner.step()
            assert resolved.measured.first_after is None and (resolved.pending is None or
                                                     resolved.pending.change != state.pending.change)
            break
        if state.at_rest:
            break
    assert seen_extra


def test_a_fix_may_give_back_replicas_a_kept_trim_shed_but_trims_never_revisit():
    world = _world()
    tuner = Tuner(_problem(), world, world, MemoryStateStore())
    three, two = POOR.with_changes(replicas=3), POOR.with_changes(replicas=2)
    kept = [HistoryRecord(iteration=i, time=now_utc(), knob=Knob.REPLICAS, change="c", reason="r", config=c,
                          verdict=Verdict.KEPT, trim=c is two) for i, c in enumerate((three, two))]
    other = POOR.with_changes(max_num_seqs=64, replicas=3)  # kept once too, but not the same config with more replicas
    kept.append(HistoryRecord(iteration=3, time=now_utc(), knob=Knob.MAX_NUM_SEQS, change="c", reason="r",
                              config=other, verdict=Verdict.KEPT))
    state = TuningState.initial(POOR).evolve(current=two, history=tuple(kept),
                                             tried_keys=frozenset(c.key() for c in (POOR, three, two, other)))
    world.apply(two)
    window = world.measure(10)
    for_fix = tuner._policy_input(state, window, revisit_kept=True).excluded_keys
    for_trim = tuner._policy_input(state, window).excluded_keys
    assert three.key() not in for_fix and three.key() in for_trim
    assert other.key() in for_fix and two.key() in for_fix


def test_the_loop_prices_configs_on_the_hardware_it_measures():
    """Hardware 1.6x slower than its profile (a busy neighbour, another build): after one window the loop knows, says
    so in the diagnosis, and its floors follow: a TPOT target the profile puts within reach is not on this part."""
    light = WorkloadSpec(profile=Profile.CHAT, request_rate_per_s=2)
    tight = SLOSpec.model_validate({"tpot": {"p50": 8}})
    world = _world(H100.slower(1.6), light)
    tuner = Tuner(_problem(slo=tight, workload=light), world, world, MemoryStateStore())
    state = tuner.step()
    assert len(state.learned.speed_ratios) == 1 and state.learned.speed_ratios[0] == pytest.approx(1.6, rel=0.1)
    assert state.diagnosis is not None and any("the profile's time" in line for line in state.diagnosis.evidence)
    assert state.measured.baseline is not None
    measured = tuner._diagnose(state, POOR, state.measured.baseline)
    profiled = tuner._diagnose(state.evolve(speed_ratios=()), POOR, state.measured.baseline)
    assert measured.floors.tpot_ms == pytest.approx(1.6 * profiled.floors.tpot_ms, rel=0.1)
    assert profiled.floors.tpot_ms < 8 < measured.floors.tpot_ms
    assert measured.below_floor == ("tpot_p50",) and profiled.below_floor == ()
    assert state.pending is not None and state.pending.proposal.knob in (Knob.SPECULATIVE, Knob.QUANTIZATION)
