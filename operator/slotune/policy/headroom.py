"""Headroom: a trim to fewer replicas broke the SLO once; make, at the current count where the SLO holds, the change
that failed window calls for, then try the fewer replicas again. Only for a near miss (HEADROOM_MAX_MISS): fewer
replicas that missed by more are not worth one change.
"""

from __future__ import annotations

from dataclasses import replace

from slotune.api.tuning import Knob
from slotune.knobs import RuntimeConfig
from slotune.policy.diagnosis import Diagnosis
from slotune.policy.inputs import PolicyInput, Proposal
from slotune.policy.remedies import remedies_for
from slotune.policy.sizing import admissible, describe_change
from slotune.policy.worst_miss import badness
from slotune.slo import SLOSpec
from slotune.snapshot import MetricsSnapshot

HEADROOM_MAX_MISS = 1.5  # fewer replicas that missed the SLO by more than this are not worth one headroom change


def worth_headroom(slo: SLOSpec, failed_window: MetricsSnapshot) -> bool:
    """Whether the window of the fewer replicas missed the SLO by little enough for one headroom change."""
    return badness(slo, failed_window) <= HEADROOM_MAX_MISS


def propose_headroom(diagnosis: Diagnosis, failed: PolicyInput, current: RuntimeConfig) -> Proposal | None:
    """A trim to fewer replicas broke the SLO. The remedy the failed window calls for at the fewer replicas (`failed`
    describes that config and window), made here at the current count where the SLO holds, so that the next try at
    fewer replicas starts with it. Kept only if the SLO still holds, like every trim."""
    if diagnosis.primary is None:
        return None
    here = replace(failed, config=current)
    target = failed.slo.targets()[0]
    for config, knob, why, *_ in remedies_for(diagnosis, failed):
        if knob is Knob.REPLICAS:
            continue
        moved = current.with_changes(**{name: getattr(config, name) for name in failed.config.changed_knobs(config)})
        if admissible(moved, knob, here):
            return Proposal(moved, knob, describe_change(current, moved, knob),
                            f"{why} (seen at {failed.config.replicas} replicas, which broke the SLO)", target.metric,
                            target.percentile, trim=True)
    return None
