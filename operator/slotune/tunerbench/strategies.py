"""The tuning strategies compared, each given the same budget of applied configurations.

- slotune: `slotune.loop.Tuner` against the simulated deployment (diagnose, change one knob, verify); the first
  window of each applied config is the scored replay, later windows of it are fresh traffic, each on the machine's
  speed in that window (`Scenario.speed`: 1 unless the scenario is noisy). Its decisions and windows are recorded
  for the noise-free judgement after the run (tunerbench.honesty).
- grid: a coarse sweep of the whole space, as vLLM's auto_tune sweeps max_num_seqs x max_num_batched_tokens: `budget`
  points evenly spaced through the space's product order.
- random: uniform samples of the space without replacement.
- tpe: Optuna's Tree-structured Parzen Estimator (Bergstra et al. 2011) over the same categorical space, maximising
  goodput (SLO-violating configs ranked by how far they miss).
Every strategy's trace is the list of configurations it applied, with each one's evaluation.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field, replace

import numpy as np
import optuna

from slotune.api.status import Phase, Verdict
from slotune.knobs import RuntimeConfig
from slotune.loop import ApplyResult, MemoryStateStore, Tuner, TuningProblem, TuningState
from slotune.metrics.window import MetricsUnavailable, UnavailableReason
from slotune.policy import infeasible_evidence
from slotune.policy.diagnosis import diagnose
from slotune.snapshot import MetricsSnapshot
from slotune.tunerbench.evaluator import Evaluation, Evaluator
from slotune.tunerbench.space import all_configs, config_of, dimensions


@dataclass(frozen=True)
class Decision:
    """A change the loop judged (slotune): kept or rolled back, from which config, after how many measured windows."""

    previous: RuntimeConfig
    config: RuntimeConfig
    kept: bool
    trim: bool  # a cost-saving change made while the SLO held
    window: int  # windows measured when it was judged (which traffic judged it: Evaluator.traffic)


@dataclass(frozen=True)
class MeasuredWindow:
    """One window slotune measured: which traffic (phase, index), the machine's speed, what ran and whether it met;
    `trimmed_from` is the config before the trim that led to what ran, while that trim's config serves."""

    number: int
    phase: int
    index: int
    speed: float
    config: RuntimeConfig
    met: bool
    trimmed_from: RuntimeConfig | None = None


@dataclass
class Trace:
    strategy: str
    applied: list[Evaluation] = field(default_factory=list)
    final: RuntimeConfig | None = None
    declared_infeasible: bool = False
    regressions: int = 0  # applied configs that scored below the config serving just before them
    changes_to_infeasible: int | None = None  # configs applied when the loop first said Infeasible (slotune)
    # The first measured window in which the policy's model alone said no allowed config can meet the SLO
    # (policy.infeasible_evidence), and the configs applied by then (slotune).
    evidence: str | None = None
    changes_at_evidence: int | None = None
    decisions: list[Decision] = field(default_factory=list)  # slotune's kept and rolled-back changes
    windows: list[MeasuredWindow] = field(default_factory=list)  # slotune's measured windows

    def note(self, state: TuningState) -> None:
        if state.phase is Phase.INFEASIBLE and self.changes_to_infeasible is None:
            best_effort = state.pending is not None and state.pending.applied  # made in the same step, after
            self.changes_to_infeasible = len(self.applied) - best_effort


@dataclass
class _EvaluatedDeployment:
    """Backend and measurement source for the loop, served from the evaluator: a config's first window is its scored
    one, later windows of it fresh traffic (Evaluator.window)."""

    evaluator: Evaluator
    trace: Trace
    running: RuntimeConfig | None = None
    windows_measured: dict[str, int] = field(default_factory=dict)  # per config key, across its applications
    num_windows: int = 0  # measured in all, for a scenario whose traffic shifts
    last: tuple[MetricsSnapshot, RuntimeConfig] | None = None  # the latest window and the config it measured
    latest: dict[str, MetricsSnapshot] = field(default_factory=dict)  # per config key, its latest window
    start_key: str | None = None
    trim: tuple[RuntimeConfig, RuntimeConfig] | None = None  # a trim's config and the one before it, while it serves

    def apply(self, config: RuntimeConfig) -> ApplyResult:
        if config == self.running:
            return ApplyResult.success(changed=False)  # the loop's check that what runs is still the config
        evaluation = self.evaluator.evaluate(config)
        if self.running is None and self.start_key is None:
            self.start_key = config.key()
        # A config applied again (a rollback, the start included) is not a new one: the baselines never re-apply
        # one either, so every strategy counts distinct configurations after the start.
        if self.running is not None and config.key() not in _seen(self.trace) | {self.start_key}:
            self.trace.applied.append(evaluation)
            self.trace.regressions += evaluation.score < self.evaluator.evaluate(self.running).score
        if not evaluation.starts:
            return ApplyResult.failure(self.evaluator.simulated.startup_error(config) or "failed", crashed=True)
        self.running = config
        return ApplyResult.success()

    def ready(self) -> bool:
        return self.running is not None

    def measure(self, window_s: float) -> MetricsSnapshot:
        if self.running is None:
            raise MetricsUnavailable(UnavailableReason.UNREACHABLE, "nothing is running")
        self.num_windows += 1
        phase, source = self.evaluator.traffic(self.num_windows)
        key = f"{phase} {self.running.key()}"
        index, speed = self.windows_measured.get(key, 0), self.evaluator.scenario.speed(self.num_windows)
        snapshot = source.window(self.running, index, speed)
        self.windows_measured[key] = index + 1
        assert snapshot is not None
        self.last = (snapshot, self.running)
        self.latest[self.running.key()] = snapshot
        if self.trim is not None and self.trim[0] != self.running:
            self.trim = None  # another config serves: later windows are not the trim's
        self.trace.windows.append(MeasuredWindow(self.num_windows, phase, index, speed, self.running,
                                                 source.scenario.slo.is_met(snapshot),
                                                 self.trim[1] if self.trim is not None else None))
        return snapshot


def _seen(trace: Trace) -> set[str]:
    return {e.config.key() for e in trace.applied}


def run_slotune(evaluator: Evaluator, budget: int) -> Trace:
    scenario = evaluator.scenario
    trace = Trace("slotune")
    tuning = scenario.tuning.model_copy(update={"max_iterations": budget, "cooldown_s": 0.0, "min_samples": 10})
    declared = evaluator.phases[0][1].scenario.workload  # the spec's workload: before any shift
    problem = TuningProblem(scenario.slo, tuning, evaluator.deployment, scenario.start, declared)
    backend = _EvaluatedDeployment(evaluator, trace)
    tuner = Tuner(problem, backend, backend, MemoryStateStore())

    def step() -> TuningState:
        before, windows = tuner.store.load() or TuningState.initial(problem.initial), backend.num_windows
        applied = len(trace.applied)  # the step may measure and then apply: the window counts what ran before
        state = tuner.step()
        if backend.num_windows > windows and trace.evidence is None and backend.last is not None:
            _look_for_evidence(tuner, before, *backend.last, trace, applied)
            restored = backend.running
            if trace.evidence is None and restored is not None and restored != backend.last[1] and \
                    before.phase is not Phase.INFEASIBLE and restored.key() in backend.latest:
                # A rollback: the loop asks the policy again about the restored config's window, now knowing the
                # change measured (e.g. speculation at that very config); so does the evidence, at this window.
                _look_for_evidence(tuner, state.evolve(phase=before.phase), backend.latest[restored.key()],
                                   restored, trace, applied)
        trace.note(state)
        _note_decisions(before, state, trace, backend)
        return state

    for _ in range(3 * budget + 4):
        state = step()
        if state.at_rest:
            break
    for _ in range(60 * (len(evaluator.phases) - 1)):  # traffic that shifts: serve until the last shift was seen
        if backend.num_windows > evaluator.after_windows + 4 and state.at_rest:
            break
        state = step()  # a loop at rest may not measure: bounded by steps, not windows
    trace.final = state.learned.best if state.phase is Phase.INFEASIBLE and state.learned.best else state.current
    trace.declared_infeasible = state.phase is Phase.INFEASIBLE
    return trace


def _note_decisions(before: TuningState, state: TuningState, trace: Trace, backend: _EvaluatedDeployment) -> None:
    """The changes this step kept or rolled back (judged later, noise-free: tunerbench.honesty), and a trim just
    applied, so that the windows it serves are known as the trim's."""
    pending = before.pending
    seen = {(h.iteration, h.time) for h in before.history}
    for entry in state.history:
        if (entry.iteration, entry.time) in seen or entry.verdict not in (Verdict.KEPT, Verdict.ROLLED_BACK):
            continue
        if pending is not None and pending.config.key() == entry.config.key():
            trace.decisions.append(Decision(pending.previous, entry.config, entry.verdict is Verdict.KEPT,
                                            entry.trim, backend.num_windows))
    now = state.pending
    if now is not None and now.applied and now.proposal.trim and backend.running == now.config:
        backend.trim = (now.config, now.previous)


def _look_for_evidence(tuner: Tuner, state: TuningState, snapshot: MetricsSnapshot, running: RuntimeConfig,
                       trace: Trace, applied: int) -> None:
    """Whether the window just measured already told the policy's model that no allowed config meets the SLO: the
    point from which the changes to an Infeasible verdict are counted. Asked of the policy with what the loop knew
    before the window (measured speed, acceptance), as the loop would ask it; only while feasibility is open (a
    shifted workload is judged afresh by the caller's scoring, not here)."""
    if tuner.problem.slo.is_met(snapshot) or state.phase is Phase.INFEASIBLE:
        return
    given = replace(tuner._policy_input(state, snapshot), config=running)
    diagnosis = diagnose(snapshot, running, tuner.problem.slo, given.deployment, tuner.problem.workload,
                         tuner.problem.tuning, state.learned.spec_acceptance, tuner.problem.draft_model)
    found = infeasible_evidence(diagnosis, given)
    if found is not None:
        trace.evidence, trace.changes_at_evidence = found, applied


def _seed(evaluator: Evaluator, seed: int) -> int:
    """A stochastic baseline's seed for this scenario: independent draws per scenario. The same seed in every
    scenario draws the same knob choices everywhere, so a lucky or unlucky first draw would count 18 times."""
    return zlib.crc32(f"{evaluator.scenario.name}/{seed}".encode())


def run_grid(evaluator: Evaluator, budget: int) -> Trace:
    space = all_configs(evaluator.scenario)
    picks = np.unique(np.linspace(0, len(space) - 1, min(budget, len(space))).round().astype(int))
    return _trace("grid", evaluator, [space[i] for i in picks])


def run_random(evaluator: Evaluator, budget: int, seed: int = 0) -> Trace:
    space = all_configs(evaluator.scenario)
    return _trace("random", evaluator, random.Random(_seed(evaluator, seed)).sample(space, min(budget, len(space))))


def run_tpe(evaluator: Evaluator, budget: int, seed: int = 0) -> Trace:
    dims = dimensions(evaluator.scenario)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=_seed(evaluator, seed)))
    tried: list[RuntimeConfig] = []
    for _ in range(budget):
        trial = study.ask()
        choice = {d.knob: d.values[trial.suggest_categorical(d.knob.value, list(range(len(d.values))))]
                  for d in dims}
        config = config_of(evaluator.scenario, choice)
        tried.append(config)
        study.tell(trial, evaluator.evaluate(config).score)
    return _trace("tpe", evaluator, tried)


def _trace(name: str, evaluator: Evaluator, configs: list[RuntimeConfig]) -> Trace:
    trace = Trace(name)
    trace.applied = [evaluator.evaluate(c) for c in configs]
    previous = evaluator.evaluate(evaluator.scenario.start)
    for evaluation in trace.applied:
        trace.regressions += evaluation.score < previous.score
        previous = evaluation
    best = max(trace.applied, key=lambda e: e.score, default=None)
    trace.final = best.config if best is not None else None
    return trace


STRATEGIES = {"slotune": run_slotune, "grid": run_grid, "random": run_random, "tpe": run_tpe}
