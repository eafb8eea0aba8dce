"""The arrival rate a start-up time ahead: Holt's linear trend over the windows measured so far, with its error.

Capacity control orders replicas for the load that will arrive when they serve, not for the load of the window that
just ended: a replica ordered now serves `startup_s` later, so the plan is for the rate a start-up plus a window
ahead. Holt's double exponential smoothing (Holt 1957; Hyndman & Athanasopoulos, "Forecasting: Principles and
Practice", section 8.2) tracks a level and a trend per window and needs no history beyond them, so the forecast
lives in the status as three numbers. The upper forecast adds `Z_UPPER` times the smoothed absolute one-step error
(mean absolute deviation x 1.25 ~ one standard deviation for normal errors), so a jumpy trace asks for more room
than a smooth one at the same mean. Only past windows enter: no strategy sees future arrivals.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

LEVEL_ALPHA = 0.6  # weight of the newest window in the level: a minute-scale trace moves within a few windows
TREND_BETA = 0.5  # weight of the newest level change in the trend: a rise is planned for from its second window
ERROR_GAMMA = 0.3  # weight of the newest one-step error in the error scale
Z_UPPER = 1.25  # upper forecast = point + Z_UPPER * 1.25 * mean absolute error (~ the 80th-90th percentile)
MAX_TREND_WINDOWS = 4.0  # a trend is extrapolated at most this many windows ahead: beyond, it is guesswork


class RateForecast(BaseModel):
    """Holt's state after the windows seen: level and trend in requests/s (trend per window), and the error scale."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    level_per_s: float
    last_per_s: float = 0.0  # the newest window's rate: what the replicas face right now
    trend_per_window: float = 0.0
    error_per_s: float = 0.0
    windows: int = 1

    @classmethod
    def first(cls, rate_per_s: float) -> RateForecast:
        return cls(level_per_s=rate_per_s, last_per_s=rate_per_s)

    def observe(self, rate_per_s: float) -> RateForecast:
        """The state after one more window's measured arrival rate."""
        predicted = self.level_per_s + self.trend_per_window
        level = LEVEL_ALPHA * rate_per_s + (1 - LEVEL_ALPHA) * predicted
        trend = TREND_BETA * (level - self.level_per_s) + (1 - TREND_BETA) * self.trend_per_window
        error = ERROR_GAMMA * abs(rate_per_s - predicted) + (1 - ERROR_GAMMA) * self.error_per_s
        return RateForecast(level_per_s=level, last_per_s=rate_per_s, trend_per_window=trend, error_per_s=error,
                            windows=self.windows + 1)

    def point_per_s(self, windows_ahead: float) -> float:
        """The expected rate `windows_ahead` windows after the last one measured (never below zero)."""
        ahead = min(max(windows_ahead, 0.0), MAX_TREND_WINDOWS)
        return max(self.level_per_s + self.trend_per_window * ahead, 0.0)

    def upper_per_s(self, windows_ahead: float) -> float:
        """A rate the next windows stay under unless the trace jumps beyond its recent errors; a rise counts at once
        (the newest window's rate, or the trend from it), a fall only as far as the level has followed it."""
        rising = max(self.point_per_s(windows_ahead), self.level_per_s, self.last_per_s)
        return rising + Z_UPPER * 1.25 * self.error_per_s

    def rising(self) -> bool:
        return self.trend_per_window > self.error_per_s * 0.25
