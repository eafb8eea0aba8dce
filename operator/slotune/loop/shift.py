"""Workload shift: did the measured load of a window move away from the windows the loop came to rest on?

The loop rests (Converged, Infeasible) on a reference: the load summaries of the windows judged since it came to
rest. A new window is a shift when any of four statistics moved, each by a stated test and by at least a minimum
effect (small real drifts are not worth re-tuning, and real traffic is burstier than the tests assume):
- request rate: the exact conditional test of two Poisson rates (given N = N_ref + N_new arrivals, N_new is
  Binomial(N, T_new / (T_ref + T_new)) when the rates are equal; Przyborowski & Wilenski 1940, the textbook exact
  rate-ratio test), two-sided, and the rate ratio outside [1 / (1 + MIN_CHANGE), 1 + MIN_CHANGE];
- mean prompt and mean output length, and the prefix-cache hit rate: window summaries only (Prometheus gives the
  window's mean, not its requests), so the new window's value is tested against the two-sided Student-t prediction
  interval of the reference windows' values (Hahn & Meeker 1991, "Statistical Intervals", s.4.4), with at least two
  reference windows; the means must also move by MIN_CHANGE (relative), the hit rate by MIN_HIT_RATE_CHANGE (absolute).
  With a single reference window there is no spread to test against, so these wait for a second one: a mean read
  from Prometheus over a short window (two counters' extrapolated increases) moved x0.5 on a steady load in the e2e.
Each test runs at ALPHA / 4 (Bonferroni over the four), so on a steady workload the chance that one window is
flagged is at most ALPHA (1%) when arrivals are Poisson and window means roughly normal, and lower in practice since
the minimum effects must be crossed too; tests/unit/loop/test_loop_shift.py counts false alarms over steady windows.

A window whose rate moved beyond the minimum effect without a test to show it is held beside the reference, not
added to it (`watch`): the next windows are pooled with it and tested together, and the held ones join the reference
only once the pooled rate is back within the minimum effect. Added at once, a small window of a real drop dragged the
reference down to meet it, and the drop was never flagged: a busy CI box measured 26 and 52 requests in the two
windows the loop came to rest on, then 22, 22, 17... (x0.56, p = 0.02, not beyond ALPHA / 4 alone), and two
replicas served half the load for good. Held and pooled, three such windows are flagged (p < 0.001).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from pydantic import BaseModel, ConfigDict
from scipy import stats

from slotune.snapshot import MetricsSnapshot

ALPHA = 0.01  # false-alarm rate per window on a steady workload, all four tests together
MIN_CHANGE = 0.5  # relative change of the rate or a mean length that counts (x1.5 or x1/1.5)
MIN_HIT_RATE_CHANGE = 0.2  # absolute change of the prefix-cache hit rate that counts
MAX_REFERENCE = 8  # latest windows kept as the reference
_PER_TEST = ALPHA / 4


class WindowLoad(BaseModel):
    """The workload one window measured: arrivals over the seconds they spanned, mean lengths, hit rate."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests: int
    seconds: float
    mean_prompt_tokens: float
    mean_output_tokens: float
    hit_rate: float | None = None

    @classmethod
    def of(cls, snapshot: MetricsSnapshot) -> WindowLoad:
        requests = snapshot.num_requests + snapshot.num_failed_requests
        rate = snapshot.request_rate_per_s
        seconds = requests / rate if rate > 0 and requests > 0 else snapshot.window_s  # the span the rate is over
        return cls(requests=requests, seconds=max(seconds, 1e-9), mean_prompt_tokens=snapshot.mean_prompt_tokens or 0.0,
                   mean_output_tokens=snapshot.mean_generation_tokens or 0.0, hit_rate=snapshot.prefix_cache_hit_rate)

    @property
    def rate_per_s(self) -> float:
        return self.requests / self.seconds


@dataclass(frozen=True)
class LoadShift:
    """What moved: the statistic, from, to, the ratio (or difference) and the test's p-value."""

    statistic: str
    before: float
    after: float
    p_value: float
    windows: int = 1  # the windows pooled into `after` (held ones, then the latest)

    @property
    def fell(self) -> bool:
        return self.after < self.before

    @property
    def moved(self) -> str:
        """`x3.02` for a rate or a length, `+25 points` for the hit rate."""
        if self.statistic == "prefix-cache hit rate":
            return f"{(self.after - self.before) * 100:+.0f} points"
        return f"x{self.after / max(self.before, 1e-9):.2f}"

    def describe(self) -> str:
        if self.statistic == "prefix-cache hit rate":
            moved = f"{self.before:.0%} -> {self.after:.0%}"
        else:
            unit = "/s" if self.statistic == "request rate" else " tokens"
            moved = f"{self.before:.3g}{unit} -> {self.after:.3g}{unit} (x{self.after / max(self.before, 1e-9):.2f})"
        over = f" over the last {self.windows} windows" if self.windows > 1 else ""
        return f"the measured {self.statistic} moved {moved}{over}, p={self.p_value:.2g}"


@dataclass(frozen=True)
class Watched:
    """One window watched at rest: the shift it shows, or the reference and the held windows after it."""

    shift: LoadShift | None
    reference: tuple[WindowLoad, ...]
    held: tuple[WindowLoad, ...] = ()


def watch(reference: Sequence[WindowLoad], held: Sequence[WindowLoad], now: WindowLoad) -> Watched:
    """`now` against the reference, alone and pooled with the held windows before it (see the module docstring)."""
    if not reference:
        return Watched(None, (now,))
    candidate = (*held, now)
    pool = pooled(candidate)
    if (shift := detect_shift(reference, now)) is not None:
        return Watched(shift, tuple(reference))
    if held and (shift := detect_shift(reference, pool)) is not None:
        return Watched(replace(shift, windows=len(candidate)), tuple(reference))
    if len(candidate) < MAX_REFERENCE and _rate_moved(reference, pool):  # still moved: hold on
        return Watched(None, tuple(reference), candidate)
    if _rate_moved(reference, now):  # the held ones rejoin (it moved the other way, or they are too many)
        return Watched(None, (*reference, *held)[-MAX_REFERENCE:], (now,))
    return Watched(None, (*reference, *candidate)[-MAX_REFERENCE:])


def pooled(windows: Sequence[WindowLoad]) -> WindowLoad:
    """Consecutive windows as one: their arrivals over their seconds, the lengths and hit rate weighted by requests."""
    requests = sum(w.requests for w in windows)
    weights = [w.requests or 1 for w in windows]

    def mean(values: list[float]) -> float:
        return float(np.average(values, weights=weights))

    rates = [w.hit_rate for w in windows]
    return WindowLoad(requests=requests, seconds=sum(w.seconds for w in windows),
                      mean_prompt_tokens=mean([w.mean_prompt_tokens for w in windows]),
                      mean_output_tokens=mean([w.mean_output_tokens for w in windows]),
                      hit_rate=None if None in rates else mean(rates))  # type: ignore[arg-type]


def _rate_moved(reference: Sequence[WindowLoad], now: WindowLoad) -> bool:
    """Whether `now`'s rate is beyond the minimum effect from the reference's, tested or not."""
    requests = sum(w.requests for w in reference)
    if requests <= 0 or now.requests <= 0:
        return False
    ratio = now.rate_per_s / (requests / sum(w.seconds for w in reference))
    return not 1 / (1 + MIN_CHANGE) <= ratio <= 1 + MIN_CHANGE


def detect_shift(reference: Sequence[WindowLoad], now: WindowLoad) -> LoadShift | None:
    """The first statistic that moved beyond its test and minimum effect, or None (see the module docstring)."""
    if not reference:
        return None
    return (_rate_shift(reference, now)
            or _summary_shift("mean prompt length", [w.mean_prompt_tokens for w in reference], now.mean_prompt_tokens)
            or _summary_shift("mean output length", [w.mean_output_tokens for w in reference], now.mean_output_tokens)
            or _hit_rate_shift(reference, now))


def _rate_shift(reference: Sequence[WindowLoad], now: WindowLoad) -> LoadShift | None:
    if not _rate_moved(reference, now):
        return None
    requests, seconds = sum(w.requests for w in reference), sum(w.seconds for w in reference)
    p = rate_ratio_p_value(requests, seconds, now.requests, now.seconds)
    return LoadShift("request rate", requests / seconds, now.rate_per_s, p) if p < _PER_TEST else None


def rate_ratio_p_value(requests_a: int, seconds_a: float, requests_b: int, seconds_b: float) -> float:
    """Two-sided exact p-value that two Poisson counts over their exposures share one rate."""
    return float(stats.binomtest(requests_b, requests_a + requests_b, seconds_b / (seconds_a + seconds_b)).pvalue)


def _summary_shift(name: str, values: Sequence[float], value: float) -> LoadShift | None:
    before = float(np.mean(values))
    if before <= 0 or 1 / (1 + MIN_CHANGE) <= value / before <= 1 + MIN_CHANGE:
        return None
    p = prediction_p_value(values, value)
    return LoadShift(name, before, value, p) if p < _PER_TEST else None


def _hit_rate_shift(reference: Sequence[WindowLoad], now: WindowLoad) -> LoadShift | None:
    values = [w.hit_rate for w in reference if w.hit_rate is not None]
    if not values or now.hit_rate is None:
        return None
    before = float(np.mean(values))
    if abs(now.hit_rate - before) <= MIN_HIT_RATE_CHANGE:
        return None
    p = prediction_p_value(values, now.hit_rate)
    return LoadShift("prefix-cache hit rate", before, now.hit_rate, p) if p < _PER_TEST else None


def prediction_p_value(values: Sequence[float], value: float) -> float:
    """Two-sided p-value of a new observation against the Student-t prediction interval of `values`; 1 with fewer
    than two values (no spread to test against), 0 for any change from values with no spread at all."""
    n = len(values)
    if n < 2:
        return 1.0
    sd = float(np.std(values, ddof=1))
    if sd <= 0:
        return 0.0 if value != values[0] else 1.0
    t = abs(value - float(np.mean(values))) / (sd * np.sqrt(1 + 1 / n))
    return float(2 * stats.t.sf(t, n - 1))
