"""A replay's figures per pass: share of requests meeting every SLO target (unfinished ones miss), share of windows
whose percentiles meet, GPU-hours (start-up time paid: a replica costs from its order), changes per hour, and the
worst window (the lowest share of requests meeting the SLO among those arriving in one window)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

from slotune.slo import SLOSpec
from slotune.tracebench.attainment import request_meets
from slotune.tracebench.replay import Replayed


@dataclass(frozen=True)
class PassFigures:
    attainment: float
    window_attainment: float
    gpu_hours: float
    changes_per_hour: float
    worst_window: float

    def as_json(self) -> dict[str, float]:
        return {k: round(v, 5) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class StrategyFigures:
    """One strategy's replay, scored: both passes' figures and what it ran at the end."""

    strategy: str
    engine_config: str
    variant: str
    config: str
    second: PassFigures
    first: PassFigures


def pass_figures(run: Replayed, slo: SLOSpec, index: int, window_s: float) -> PassFigures:
    begin_s, end_s = index * run.pass_s, (index + 1) * run.pass_s
    arrived = Counter(int(r.arrival_s // window_s) for r in run.requests if begin_s <= r.arrival_s < end_s)
    met = Counter(int(r.arrival_s // window_s) for r in run.finished
                  if begin_s <= r.arrival_s < end_s and request_meets(slo, r))
    total = sum(arrived.values())
    windows = [w for w in run.windows if begin_s < w.end_s <= end_s + 1e-9]
    judged = [w for w in windows if w.snapshot.num_requests > 0]
    gpu_start_s = max((w.gpu_seconds for w in run.windows if w.end_s <= begin_s + 1e-9), default=0.0)
    gpu_end_s = windows[-1].gpu_seconds if windows else gpu_start_s
    changes = sum(begin_s <= t < end_s for t in run.changes_s)
    return PassFigures(
        attainment=sum(met.values()) / total if total else 1.0,
        window_attainment=sum(slo.is_met(w.snapshot) for w in judged) / len(judged) if judged else 1.0,
        gpu_hours=(gpu_end_s - gpu_start_s) / 3600.0,
        changes_per_hour=changes / (run.pass_s / 3600.0),
        worst_window=min((met[w] / n for w, n in arrived.items()), default=1.0),
    )
