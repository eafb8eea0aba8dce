"""Which values of a measured window are inside their domain, before anything is judged on them.

Engines and scrapes report what their counters say, and counters lie in known ways: a restarted engine's counters
start again (a window's delta goes negative, a histogram's counts go backwards), a simulator or engine counts more
accepted than drafted tokens (acceptance 3.34 was seen), a division by an empty window gives NaN. `checked` sorts a
window's values in two: a latency, a request count, the window's length or a rate a verdict is drawn from that is
out of its domain makes the whole window untrustworthy (discarded, and said why); an auxiliary reading (a ratio, a
gauge, a mean length) out of its domain is dropped (None), said, and the window judged on the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from slotune.snapshot import LatencyMetric, LatencySummary, MetricsSnapshot

# Readings that are ratios of two counts: each must lie in [0, 1].
_FRACTIONS = ("prefix_cache_hit_rate", "spec_acceptance_rate", "kv_cache_usage")
# Optional counts, means of counts and the arrival rate: >= 0 (spec_mean_acceptance_length: >= 1, checked apart).
_OPTIONAL_COUNTS = ("mean_prompt_tokens", "mean_generation_tokens", "num_running_mean", "num_waiting_mean",
                    "num_waiting_end", "arrival_rate_per_s")
# Rates a verdict is drawn from (throughput floor, load shift, capacity): a negative one is a counter reset.
_RATES = ("request_rate_per_s", "prompt_tokens_per_s", "generation_tokens_per_s")


@dataclass(frozen=True)
class DomainCheck:
    """`snapshot`: the window with its out-of-domain auxiliary readings dropped; None when it is discarded.
    `discarded`: why the window cannot be judged; `ignored`: the readings dropped, each with its value."""

    snapshot: MetricsSnapshot | None
    discarded: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.discarded:
            return "window discarded, measurements outside their domain: " + "; ".join(self.discarded)
        return "ignored measurements outside their domain: " + "; ".join(self.ignored) if self.ignored else ""


def _finite_at_least(value: float | None, lowest: float) -> bool:
    return value is None or (isinstance(value, int | float) and math.isfinite(value) and value >= lowest)


def _latency_faults(name: str, summary: LatencySummary) -> list[str]:
    faults = [f"{name} {label} {value}" for label, value in (("p50", summary.p50_ms), ("p95", summary.p95_ms),
                                                            ("p99", summary.p99_ms), ("mean", summary.mean_ms))
              if not _finite_at_least(value, 0.0)]
    if summary.count < 0:
        faults.append(f"{name} count {summary.count}")
    if summary.samples_ms is not None and not all(_finite_at_least(v, 0.0) for v in summary.samples_ms):
        faults.append(f"{name} samples not all finite and >= 0")
    if summary.histogram is not None and not all(_finite_at_least(c, 0.0) for c in summary.histogram.counts):
        faults.append(f"{name} histogram counts went backwards ({min(summary.histogram.counts)})")
    return faults


def _window_faults(snapshot: MetricsSnapshot) -> list[str]:
    faults = [] if _finite_at_least(snapshot.window_s, 1e-9) else [f"window_s {snapshot.window_s}"]
    faults += [f"num_requests {snapshot.num_requests}"] if snapshot.num_requests < 0 else []
    faults += [f"num_failed_requests {snapshot.num_failed_requests}"] if snapshot.num_failed_requests < 0 else []
    faults += [f"{name} {getattr(snapshot, name)}" for name in _RATES
               if not _finite_at_least(getattr(snapshot, name), 0.0)]
    for metric in LatencyMetric:
        faults += _latency_faults(metric.value, snapshot.latency(metric))
    return faults


def _dropped(snapshot: MetricsSnapshot) -> dict[str, object]:
    """The auxiliary readings out of their domain, each with the value it is replaced by."""
    drop: dict[str, object] = {}
    for name in _FRACTIONS:
        value = getattr(snapshot, name)
        if value is not None and not (_finite_at_least(value, 0.0) and value <= 1.0):
            drop[name] = None
    drop |= {name: None for name in _OPTIONAL_COUNTS if not _finite_at_least(getattr(snapshot, name), 0.0)}
    if not _finite_at_least(snapshot.spec_mean_acceptance_length, 1.0):
        drop["spec_mean_acceptance_length"] = None
    if not _finite_at_least(snapshot.num_preemptions, 0.0):
        drop["num_preemptions"] = 0.0
    return drop


def checked(snapshot: MetricsSnapshot) -> DomainCheck:
    """The window as it can be judged (see the module's docstring)."""
    faults = _window_faults(snapshot)
    if faults:
        return DomainCheck(None, discarded=tuple(faults))
    drop = _dropped(snapshot)
    ignored = tuple(f"{name} {getattr(snapshot, name)}" for name in drop)
    return DomainCheck(replace(snapshot, **drop) if drop else snapshot, ignored=ignored)  # type: ignore[arg-type]

