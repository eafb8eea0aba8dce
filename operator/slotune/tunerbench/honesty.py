"""Whether slotune's decisions were sound, judged noise-free after the run (the issue: does the least that works,
never mistakes a prior for a measurement, stays honest under noise).

The loop decides on the windows it measured, noise and all; the benchmark knows each config's noise-free standing on
the traffic that judged it (`Evaluator`): met configs that hold rank by goodput per replica above every other, a config
that meets its scored windows but not every later one sits at the SLO's edge, and configs that miss rank by how far.
A change is sound, noise-free, when it does what it was made for: a fix (a change made while the SLO missed, or one
adding capacity) when its config stands better than the one before (between equals, the one with more margin to the
targets: a change that moved nothing is not a fix); a trim (a cost-saving change made while the SLO held, the loop's
own `trim`) when its config holds and stands no worse, as the loop keeps a trim that still holds (policy.keep).
- a keep is false when the change kept was not sound (a replica kept "for margin" on a slow window is one: more GPUs
  for the same noise-free outcome);
- a rollback is false when the change rolled back was sound (a sound change undone on a window where the machine ran
  slow);
- GPUs at rest: the final config's replicas x GPUs per replica; where they exceed the oracle's, the report says what
  the final config does on its replicas and on the oracle's, and what the oracle's config does (`above_oracle`);
- an output-altering change in the final config (`quality.alters_outputs`: quantized weights and an fp8 KV cache, which
  allowQualityChange gates, and speculation, lossless in principle but checked by the quality gate) is unneeded when
  the final config with that knob set back to the start's value still holds the SLO;
- a window missed because of a trim: a measured window that missed, served by the config a trim led to, which the
  config before the trim meets on the same traffic at the same machine speed.
"""

from __future__ import annotations

from dataclasses import dataclass

from slotune.knobs import QUALITY_KNOBS, RuntimeConfig
from slotune.quality import alters_outputs
from slotune.tunerbench.evaluator import Evaluator
from slotune.tunerbench.strategies import Decision, Trace

EDGE = 0.0  # Evaluation.score of a config missing by a ratio of 1: met on its scored windows, not every later one
OUTPUT_KNOBS = (*sorted(QUALITY_KNOBS), "speculative")  # the knobs quality.alters_outputs looks at
HOLDS = 1.0  # the lowest Evaluation.score of a config that meets the SLO


@dataclass(frozen=True)
class Honesty:
    keeps: int
    false_keeps: int
    rollbacks: int
    false_rollbacks: int
    gpus_at_rest: int | None  # None: no final config
    unneeded_output_changes: tuple[str, ...]  # knobs that alter outputs, kept though the SLO holds without them
    windows_measured: int
    windows_missed_after_trim: int
    false_rollbacks_held: int = 0  # of the false rollbacks, those whose config holds the SLO (not a step short of it)


def judge(trace: Trace, evaluator: Evaluator, tensor_parallel: int) -> Honesty:
    keeps = [d for d in trace.decisions if d.kept]
    rollbacks = [d for d in trace.decisions if not d.kept]
    false_keeps = sum(not sound(evaluator, d) for d in keeps)
    false_rollbacks = [d for d in rollbacks if sound(evaluator, d)]
    held = sum(standing(evaluator.traffic(d.window)[1], d.config)[0] >= HOLDS for d in false_rollbacks)
    final = trace.final
    return Honesty(len(keeps), false_keeps, len(rollbacks), len(false_rollbacks),
                   None if final is None else final.replicas * tensor_parallel,
                   () if final is None else unneeded_output_changes(evaluator, final),
                   len(trace.windows), windows_missed_after_trim(trace, evaluator), held)


def standing(evaluator: Evaluator, config: RuntimeConfig) -> tuple[float, float]:
    """A config's noise-free standing on the evaluator's traffic, higher is better: its score (EDGE for one that meets
    its scored windows and does not hold: met by luck of the draw is not met), then its margin (-badness)."""
    evaluation = evaluator.evaluate(config)
    if evaluation.met and not evaluator.holds(config):
        return EDGE, -evaluation.badness
    return evaluation.score, -evaluation.badness


def sound(evaluator: Evaluator, decision: Decision) -> bool:
    """Whether the change judged did, noise-free on the traffic that judged it, what it was made for."""
    traffic = evaluator.traffic(decision.window)[1]
    after, before = standing(traffic, decision.config), standing(traffic, decision.previous)
    return after[0] >= max(before[0], HOLDS) if decision.trim else after > before


def above_oracle(evaluator: Evaluator, final: RuntimeConfig, oracle: RuntimeConfig) -> str:
    """Where slotune rests on more replicas than the oracle, what each would do noise-free: its config, the same
    config on the oracle's replicas, and the oracle's, so that a replica its config needs (a better engine config
    would not) reads apart from one bought for nothing. Empty where it rests on no more."""
    if final.replicas <= oracle.replicas:
        return ""
    fewer = final.with_changes(replicas=oracle.replicas)
    return (f"noise-free, slotune's final config {_standing_text(evaluator, final)} on {final.replicas} replicas, "
            f"{_standing_text(evaluator, fewer)} on the oracle's {oracle.replicas}; the oracle's config "
            f"{_standing_text(evaluator, oracle)}: {oracle.describe()}")


def _standing_text(evaluator: Evaluator, config: RuntimeConfig) -> str:
    evaluation = evaluator.evaluate(config)
    if not evaluation.starts:
        return "does not start"
    if evaluation.met:
        return "holds" if evaluator.holds(config) else "meets its scored windows, not every later one"
    return f"misses by x{evaluation.badness:.2f}"


def unneeded_output_changes(evaluator: Evaluator, final: RuntimeConfig) -> tuple[str, ...]:
    """The knobs of the final config that alter outputs against the start (quality.alters_outputs: quantized weights,
    an fp8 KV cache, speculation on or changed) whose start value, all else as final, still holds the SLO."""
    start = evaluator.scenario.start
    found = []
    for knob in OUTPUT_KNOBS:
        without = final.with_changes(**{knob: getattr(start, knob)})
        if alters_outputs(without, final) and evaluator.holds(without):
            found.append(knob)
    return tuple(found)


def windows_missed_after_trim(trace: Trace, evaluator: Evaluator) -> int:
    missed = 0
    for window in trace.windows:
        if window.met or window.trimmed_from is None:
            continue
        phase = evaluator.phases[window.phase][1]
        before = phase.window(window.trimmed_from, window.index, window.speed)
        missed += before is not None and phase.scenario.slo.is_met(before)
    return missed
