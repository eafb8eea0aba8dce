"""A change kept on a window the traffic made kind: did it move the windows that miss?

Before/after verification keeps a change that turned a missed window into a met one without breaking anything. The
two windows served different traffic, and the bootstrap behind "beyond noise" resamples within each window: it does
not see how much the next window's bursts differ. On a bursty workload at the SLO's edge a met window is not
evidence the change helped. In the tuner benchmark's summarization scenarios every allowed replica ran, and TTFT P99
alternated between windows that met (332-414 ms) and windows with a burst of long prompts that missed (508-660 ms)
against 500 ms: each token-budget step, 256 -> 512 -> ... -> 8192, met on its first window and was kept against the
last one's miss, and missed its next window by as much as before. The loop walked the knob to its end and called the
SLO infeasible after 8 changes.

So such a keep is provisional (`LuckyKeep`) until the config converges with confidence (slo_bound). At every
allowed replica, when a later window of that config misses the SLO before then, its targeted percentile is compared
with the baseline's missed window (verification.compare: the block bootstrap of the ratio). A change that did not
bring it down beyond noise did not move the windows that miss: that move of its knob (policy.sizing.move_direction,
e.g. "max_num_batched_tokens up") is futile here. The policy proposes it no more at this replica count
(policy.sizing.admissible; the other way may still be a fix), and the Infeasible report names it. Below maxReplicas
a miss after a lucky keep is left to the capacity remedies, which change what a window's burst meets. Futile moves
are forgotten when the loop re-opens (a spec change, a shift). A canary needs none of this: both arms serve the same
window's traffic.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from slotune.api.tuning import Knob, TuningSpec
from slotune.judge.verification import Judgement, MetricChange, compare
from slotune.knobs import RuntimeConfig
from slotune.policy.sizing import move_direction
from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric, MetricsSnapshot


class LuckyKeep(BaseModel):
    """A change kept on a window that met the SLO where the baseline's missed."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    config_key: str
    move: str  # policy.sizing.move_direction: the knob and the way it moved
    change: str
    metric: LatencyMetric
    percentile: int
    baseline: MetricsSnapshot  # the missed window it was kept against


def lucky_keep(verdict: Judgement, baseline: MetricsSnapshot, after: MetricsSnapshot, slo: SLOSpec, knob: Knob,
               change: str, previous: RuntimeConfig, config: RuntimeConfig, metric: LatencyMetric,
               percentile: int) -> LuckyKeep | None:
    """The keep to re-judge on the config's next missed window, or None when the verdict stands on its own."""
    if not verdict.keep or knob is Knob.REPLICAS:
        return None
    if slo.is_met(baseline) or not slo.is_met(after):
        return None
    return LuckyKeep(config_key=config.key(), move=move_direction(previous, config, knob), change=change, metric=metric,
                     percentile=percentile, baseline=baseline)


def futile(lucky: LuckyKeep, missed: MetricsSnapshot) -> MetricChange | None:
    """The comparison of the baseline's missed window with this missed one when it did not improve beyond noise
    (the move did not move the windows that miss); None when it did."""
    name = f"{lucky.metric.value}_p{lucky.percentile}"
    change = compare(lucky.baseline.latency(lucky.metric), missed.latency(lucky.metric), lucky.percentile, name)
    return None if change.improved else change


def at_max_replicas(config: RuntimeConfig, tuning: TuningSpec) -> bool:
    """Every replica the bounds allow (or no bound: replicas are not the tuner's to add), where a lucky keep is
    re-judged and futile moves are blocked; below it a miss is left to the capacity remedies."""
    most = tuning.bounds.max_replicas
    return most is None or config.replicas >= most


def blocked(futile_moves: tuple[str, ...], config: RuntimeConfig, tuning: TuningSpec) -> frozenset[str]:
    """The moves the policy may not propose at `config`: the futile ones, at every allowed replica only."""
    return frozenset(futile_moves) if at_max_replicas(config, tuning) else frozenset()


def rejudged(lucky: LuckyKeep, current_key: str, missed: MetricsSnapshot) -> str | None:
    """Why the lucky keep's move is futile, judged on a missed window of its config; None when it is not (the move
    did move the windows that miss, or the config running is no longer the one it was kept for)."""
    found = futile(lucky, missed) if lucky.config_key == current_key else None
    if found is None:
        return None
    return (f"kept on a window that met, then missed again as before ({found.describe()} against the baseline's "
            f"missed window): {lucky.move} does not move the windows that miss at every allowed replica")
