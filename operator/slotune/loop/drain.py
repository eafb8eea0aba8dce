"""A capacity increase is judged on the windows after the backlog it inherited has drained, not on the backlog.

Server-side histograms count a request when it finishes. When replicas are added to an overloaded deployment, the
requests that queued under the old capacity finish in the first windows after the change, each with the wait it
already had: the change is charged for the queue that made it necessary (tests/e2e/test_workload_shift.py saw
1 -> 2 replicas measured worse than 1 and rolled back). So before/after skips those windows: after a change that
adds replicas to a baseline whose engines had a backlog (mean waiting requests, all replicas together, at least
MIN_BACKLOG), a window after the change is not judged while the backlog is still falling (its waiting count below
the previous window's, and still at least MIN_BACKLOG), for at most MAX_DRAIN_WINDOWS windows. A backlog that does
not fall is the new capacity's own steady state and is judged like any other; a drain longer than the bound is
judged as it stands (the wait is bounded, so a change that never drains the queue is still decided).
The queue read is the engines' `num_requests_waiting` gauge averaged over the window (MetricsSnapshot.
num_waiting_mean, per replica); a source without it never skips.
"""

from __future__ import annotations

from slotune.loop.state import PendingChange
from slotune.snapshot import MetricsSnapshot

MIN_BACKLOG = 1.0  # requests waiting on average, all replicas together: below it there is no backlog to drain
MAX_DRAIN_WINDOWS = 2


def backlog(window: MetricsSnapshot, replicas: int) -> float | None:
    """Mean requests waiting over the window, all replicas together (None: the source does not read the queue)."""
    return None if window.num_waiting_mean is None else window.num_waiting_mean * replicas


def draining(pending: PendingChange, baseline: MetricsSnapshot, window: MetricsSnapshot) -> float | None:
    """This window's backlog when it is not to be judged (see the module docstring), else None."""
    if pending.config.replicas <= pending.previous.replicas or pending.canary_pod is not None:
        return None
    if pending.drain_windows >= MAX_DRAIN_WINDOWS:
        return None
    before = backlog(baseline, pending.previous.replicas)
    now = backlog(window, pending.config.replicas)
    if before is None or now is None or before < MIN_BACKLOG or now < MIN_BACKLOG:
        return None
    previous = before if pending.drain_backlog is None else pending.drain_backlog
    return now if now < previous else None


def describe(pending: PendingChange, now: float) -> str:
    previous = "the baseline's" if pending.drain_backlog is None else f"{pending.drain_backlog:.1f}"
    return (f"{pending.change}: the queue the old capacity left is still draining ({now:.1f} requests waiting on "
            f"average, down from {previous}); this window is not judged ({pending.drain_windows + 1} of at most "
            f"{MAX_DRAIN_WINDOWS})")
