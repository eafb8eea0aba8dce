"""A fresh baseline when the machine's speed moved between the baseline window and the candidate's.

A change is judged before/after: the baseline window of the kept config against the candidate's window. When the
hardware's own speed drifts in between (a noisy neighbour, a CPU runtime beside other jobs: issue 17 judged a
candidate at load average 8 against a baseline measured at 1-4), the verdict measures the drift, not the change.
The measured step speed (`perfmodel.window_step.speed_ratio`: a window's step time over the profile's for that very
config, batch and context) tells the two apart: it prices the config, so it should not move with the change. When
it moved by more than SPEED_DRIFT, and in the direction the verdict went (a rollback with the candidate's steps
slower, a keep with them faster), the kept config is measured again and the candidate re-applied and judged
against that fresh baseline; once per change, so a machine that keeps drifting cannot stall the loop.

A trim is judged by whether the SLO still holds, and a machine that slowed down in its window breaks the SLO for
the trim: the same re-measure applies (a 2-core CI box running other work rolled back a trim 2 -> 1 replicas on a
window whose TTFT P95 read 199 ms against 36 ms before, and never tried it again at that load). Its cost is one
more window on the fewer replicas, once per trim, which is what a slow window is not evidence enough to save.
"""

from __future__ import annotations

from slotune.judge.verification import Judgement
from slotune.loop.state import PendingChange
from slotune.perfmodel.deployment import Deployment
from slotune.perfmodel.window_step import speed_ratio
from slotune.snapshot import MetricsSnapshot

# Windows of one config on one machine read speed ratios within ~x1.3 of each other on simulated bursty traffic
# (window_step: bursts thin the occupancy); beyond x1.5 the machine, not the window, is the likelier explanation.
SPEED_DRIFT = 1.5


def speed_drift(deployment: Deployment, pending: PendingChange, baseline: MetricsSnapshot,
                snapshot: MetricsSnapshot, verdict: Judgement) -> float | None:
    """The candidate window's step speed over the baseline's (2.0: its steps took twice the profile's time that the
    baseline's did) when the verdict rests on it and the baseline was not measured afresh yet; None otherwise."""
    if pending.rebaselined or pending.canary_pod is not None or verdict.inconclusive:
        return None
    before = speed_ratio(deployment, pending.previous, baseline)
    after = speed_ratio(deployment, pending.config, snapshot)
    if before is None or after is None:
        return None
    drift = after / before
    if (not verdict.keep and drift > SPEED_DRIFT) or (verdict.keep and drift < 1.0 / SPEED_DRIFT):
        return drift
    return None


def describe(pending: PendingChange, drift: float, reason: str) -> str:
    return (f"{pending.change}: {reason}; but steps ran x{drift:.2f} the baseline's speed on the profile (the machine "
            f"drifted, not the change): measuring {pending.previous.describe()} again as a fresh baseline, then "
            f"{pending.change} again")
