"""How capacity control trades SLO risk for GPU-hours: its margins, its hysteresis and its bound on changes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CapacitySettings:
    min_replicas: int = 1
    max_replicas: int = 1
    startup_prior_s: float = 120.0  # a replica's start-up until one is measured (a GPU pod pulling weights)
    drain_windows: float = 2.0  # a backlog is planned away within this many windows
    up_headroom: float = 0.9  # replicas are added once the upper forecast needs more than this share of capacity
    down_headroom: float = 0.8  # fewer replicas must carry the upper forecast at this share of their capacity
    down_windows: int = 3  # consecutive windows in which fewer replicas would have sufficed before a trim
    max_changes_per_hour: int = 12  # trims stop once this many changes were made in the last hour
    trim_watch_windows: int = 3  # a miss this soon after a trim is the trim's: the next one needs more room
    trim_bar_step: float = 1.25  # each failed trim divides the headroom a trim may use by this much more
    max_trim_bar: float = 2.5
