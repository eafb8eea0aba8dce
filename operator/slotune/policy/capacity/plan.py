"""Capacity control, one window at a time: the replicas the next start-up's worth of load needs, ordered ahead.

Every window (whatever the configuration search is doing) the plan
1. learns: the arrival rate joins the forecast (`forecast`), and a steady window bounds the running config's
   per-replica capacity (`estimate`): a window with replicas still starting or a queue it inherited measures the
   past, not the replicas, and teaches nothing;
2. judges its own last step by what the model predicted (the queue drains, each replica serves what it was sized
   for), never by latency percentiles before and after: a scale-up that lands in a backlog built while it started
   is not the backlog's cause. A step that did less than predicted lowers the estimate instead of being undone;
3. sizes: replicas = (upper forecast a start-up plus a window ahead + the queue spread over `drain_windows`) /
   (per-replica capacity x `up_headroom`). Up at once; down only after `down_windows` windows in a row in which
   fewer replicas carry the upper forecast with headroom, nothing is starting and no queue stands, to the most
   any of them asked for, when the rate is not rising and fewer than `max_changes_per_hour` changes were made in
   the hour; never past TRIM_STRETCH x a per-replica load measured to meet the SLO (nor past a failed trim's:
   its miss bounds the estimate for good). A miss within `trim_watch_windows` after a trim raises the bar for
   the next one. Replicas still starting are cancelled before they serve once the serving ones carry the forecast
   again (on the same terms as a trim).
More than `max_replicas` needed is "infeasible at this rate": the plan runs the most it may and keeps planning,
and the condition clears when the rate falls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from slotune.policy.capacity.estimate import CapacityEstimate
from slotune.policy.capacity.forecast import RateForecast
from slotune.policy.capacity.settings import CapacitySettings
from slotune.policy.capacity.state import CapacityState, ScaleStep
from slotune.policy.capacity.window import CapacityWindow

DRAINED_SHARE = 0.5  # a scale-up did what it was for once the queue it met is below this share of it
SERVED_SHARE = 0.8  # ...or each replica served at least this share of the rate it was sized for
TRIM_STRETCH = 1.5  # a trim loads each replica at most this much beyond the most a met window measured on one


@dataclass(frozen=True)
class CapacityPlan:
    replicas: int  # the count to run from now on
    state: CapacityState
    reason: str
    verdict: str | None = None  # the judgement of the step before, once it is judged

    def changed(self, running: int) -> bool:
        return self.replicas != running


def plan(state: CapacityState, window: CapacityWindow, config_key: str, settings: CapacitySettings,
         may_trim: bool = True) -> CapacityPlan:
    """The replicas to run after `window`, with the state that remembers why. `may_trim` False (a configuration
    change is being judged) holds any trim: fewer replicas would move the load under the judgement."""
    decided = _plan(_learn(state, window, config_key), window, settings, may_trim)
    state = _read(decided.state, window, settings).model_copy(update={"message": decided.reason})
    return replace(decided, state=state)


def _read(state: CapacityState, window: CapacityWindow, settings: CapacitySettings) -> CapacityState:
    assert state.forecast is not None and state.estimate is not None
    ahead = (state.startup_s(settings.startup_prior_s) + window.window_s) / window.window_s
    return state.model_copy(update={
        "ready": window.ready, "starting": window.starting, "arrival_per_s": window.arrival_rate_per_s,
        "waiting_end": window.waiting_end,
        "forecast_per_s": state.forecast.upper_per_s(ahead),
        "per_replica_per_s": per_replica_capacity(state.estimate, window)})


def _plan(state: CapacityState, window: CapacityWindow, settings: CapacitySettings, may_trim: bool) -> CapacityPlan:
    state, verdict = _judge_step(state, window)
    state, restore = _watch_trim(state, window, settings)
    need = max(needed(state, window, settings, settings.up_headroom), restore)
    ordered = state.ordered or window.ready + window.starting
    # The rate, not the backlog it left: a queue built at a peak drains at maxReplicas once the rate falls. And
    # measured, not forecast: a window that met the SLO with no queue standing is not infeasible, whatever the
    # upper forecast says.
    strained = not window.met or window.waiting_end >= max(window.ready, 1)
    at_rate = strained and needed(state, window, settings, backlog=False) > settings.max_replicas
    state = state.model_copy(update={"infeasible_at_rate": at_rate, "ordered": ordered})
    target = min(max(need, settings.min_replicas), settings.max_replicas)
    if target > ordered:
        return _order(state, window, target, _up_reason(state, window, target, need, settings), verdict)
    cancelled = _cancelled(state, window, settings, strained, verdict)
    if cancelled is not None:
        return cancelled
    if not may_trim:
        held = state.model_copy(update={"down_windows": 0, "trim_to": 0})
        return CapacityPlan(state.ordered, held, _hold_reason(state), verdict)
    return _maybe_trim(state, window, settings, verdict)


def needed(state: CapacityState, window: CapacityWindow, settings: CapacitySettings, headroom: float = 1.0,
           backlog: bool = True) -> int:
    """Replicas for the upper forecast a start-up plus a window ahead and the queue, at `headroom` x capacity."""
    assert state.forecast is not None and state.estimate is not None
    ahead = (state.startup_s(settings.startup_prior_s) + window.window_s) / window.window_s
    demand = state.forecast.upper_per_s(ahead)
    if backlog:
        demand += window.waiting_end / (settings.drain_windows * window.window_s)
    per_replica = per_replica_capacity(state.estimate, window) * headroom
    return max(math.ceil(demand / max(per_replica, 1e-9) - 1e-9), 0)


def per_replica_capacity(estimate: CapacityEstimate, window: CapacityWindow) -> float:
    return window.prior_per_replica * estimate.factor


def _learn(state: CapacityState, window: CapacityWindow, config_key: str) -> CapacityState:
    forecast = (RateForecast.first(window.arrival_rate_per_s) if state.forecast is None
                else state.forecast.observe(window.arrival_rate_per_s))
    estimate = (state.estimate or CapacityEstimate(config_key=config_key)).for_config(config_key)
    if window.steady and window.arrival_rate_per_s > 0:
        estimate = estimate.aged()
        # A queue that shrank was served faster than it grew: some replica had room (a backlog left on one replica
        # drains there alone), so the served rate is no ceiling. Nor is it where the window began with no queue
        # (a run's first window, the end of a lull): the served rate counts finished requests, and replicas whose
        # batches were filling finished fewer than they served (a request's lifetime of work is still in flight).
        if window.saturated and _queue_grew(state, window) and _queued_at_start(state, window):
            estimate = estimate.saturated(window.served_factor())
        if window.met and window.waiting_end < window.ready:
            estimate = estimate.met(window.load_factor())
        elif not window.met and _queue_grew(state, window):
            estimate = estimate.missed(window.load_factor())
    return state.model_copy(update={"forecast": forecast, "estimate": estimate})


def _queue_grew(state: CapacityState, window: CapacityWindow) -> bool:
    """The queue at the window's end is longer than at its start (the step's, or its mean as the start's proxy)."""
    return window.waiting_end >= max(window.ready, 1) and window.waiting_end >= window.waiting_mean


def _queued_at_start(state: CapacityState, window: CapacityWindow) -> bool:
    """The window began with requests waiting on every replica (the last window read ended so)."""
    return state.forecast is not None and state.waiting_end >= max(window.ready, 1)


def _judge_step(state: CapacityState, window: CapacityWindow) -> tuple[CapacityState, str | None]:
    """A scale-up, once its replicas have served a whole window: did the queue drain or each replica serve what it
    was sized for? Either is what the model predicted; neither lowers the estimate (the served rate, saturated)."""
    step = state.last_step
    if step is None or step.judged or not step.up or not window.steady or window.ready < step.to_replicas:
        return state, None
    drained = window.waiting_end <= DRAINED_SHARE * step.waiting_at_order or window.waiting_end < window.ready
    served = window.served_rate_per_s / window.ready
    busy = served >= SERVED_SHARE * min(step.predicted_per_replica, window.arrival_rate_per_s / window.ready)
    state = state.model_copy(update={"last_step": step.model_copy(update={"judged": True})})
    if drained or busy:
        return state, (f"replicas {step.from_replicas} -> {step.to_replicas} did what the capacity model predicted: "
                       f"queue {step.waiting_at_order:.0f} -> {window.waiting_end:.0f}, {served:.2f} requests/s "
                       f"served per replica (sized for {step.predicted_per_replica:.2f})")
    assert state.estimate is not None
    estimate = state.estimate.saturated(window.served_factor())
    return state.model_copy(update={"estimate": estimate}), (
        f"replicas {step.from_replicas} -> {step.to_replicas} did less than predicted: {served:.2f} requests/s served "
        f"per replica against {step.predicted_per_replica:.2f}, queue {step.waiting_at_order:.0f} -> "
        f"{window.waiting_end:.0f}; capacity estimate now {estimate.describe()}")


def _watch_trim(state: CapacityState, window: CapacityWindow, settings: CapacitySettings) -> tuple[CapacityState, int]:
    """A window that missed soon after a trim is the trim's: the replicas it shed come back at once, the load it
    put on each is remembered as one that misses, and the next trim must leave more room. Returns the state and the
    replicas to run at least (0: no trim to undo)."""
    step = state.last_step
    if step is None or step.up or step.judged:
        return state, 0
    if window.end_s - step.at_s > settings.trim_watch_windows * window.window_s:
        return state.model_copy(update={"last_step": step.model_copy(update={"judged": True})}), 0
    if window.met:
        return state, 0
    assert state.estimate is not None
    bar = min(state.trim_bar * settings.trim_bar_step, settings.max_trim_bar)
    estimate = state.estimate.trim_missed(window.load_factor()) if window.steady else state.estimate
    return state.model_copy(update={"trim_bar": bar, "estimate": estimate,
                                    "last_step": step.model_copy(update={"judged": True})}), step.from_replicas


def _maybe_trim(state: CapacityState, window: CapacityWindow, settings: CapacitySettings,
                verdict: str | None) -> CapacityPlan:
    """Trim to the most replicas any window of the streak asked for (a stabilisation window, as the HPA scales
    down): one window asking for the current count no longer restarts the count, so a noisy rate that needs fewer
    replicas in most windows gets its trim, and to a count every window of the streak would have carried."""
    headroom = settings.down_headroom / state.trim_bar
    fewer = max(needed(state, window, settings, headroom), settings.min_replicas, _measured_floor(state, window))
    calm = window.starting == 0 and window.waiting_end < max(window.ready, 1) and window.met
    assert state.forecast is not None
    if fewer >= state.ordered or not calm:
        return CapacityPlan(state.ordered, state.model_copy(update={"down_windows": 0, "trim_to": 0}),
                            _hold_reason(state), verdict)
    streak, to = state.down_windows + 1, max(state.trim_to, fewer)
    held = state.model_copy(update={"down_windows": streak, "trim_to": to})
    if streak < settings.down_windows or state.forecast.rising():
        why = ("the rate is rising" if streak >= settings.down_windows
               else f"{streak} of {settings.down_windows} windows")
        return CapacityPlan(state.ordered, held, f"{to} replicas would carry the forecast ({why})", verdict)
    if state.changes_in_hour(window.end_s) >= settings.max_changes_per_hour:
        reason = f"{settings.max_changes_per_hour} changes this hour already: holding {state.ordered} replicas"
        return CapacityPlan(state.ordered, held, reason, verdict)
    reason = (f"the rate fell: {to} replicas carry the upper forecast "
              f"{state.forecast.upper_per_s(1):.2f} requests/s at {headroom:.0%} of their capacity "
              f"in each of the last {streak} windows")
    return _order(state, window, to, reason, verdict)


def _cancelled(state: CapacityState, window: CapacityWindow, settings: CapacitySettings, strained: bool,
               verdict: str | None) -> CapacityPlan | None:
    """Replicas still starting are cancelled before they serve once the replicas serving carry the forecast again:
    ordered for a burst that has passed, each would hold its GPUs through the rest of its start-up and then
    `down_windows` calm windows before a trim let it go (on the 70B trace pairs, about a tenth of a day's GPU-hours).
    All of them or none: cancelling some while others still start would follow every swing of a noisy rate, order
    and cancel in turn. On the trim's terms: the window met with no queue standing, the rate is not rising, the
    serving replicas carry the upper forecast a start-up ahead at the trim's headroom, and the hour's change bound
    holds. A miss after it is a trim's miss (`_watch_trim`): the replicas come back and the bar rises. The fleet
    drops the replicas still starting first, as a ReplicaSet deletes its unready pods first."""
    assert state.forecast is not None
    if not window.starting or strained or state.forecast.rising():
        return None
    headroom = settings.down_headroom / state.trim_bar
    fewer = max(window.ready, settings.min_replicas)
    if needed(state, window, settings, headroom) > fewer or fewer >= state.ordered or (
            state.changes_in_hour(window.end_s) >= settings.max_changes_per_hour):
        return None
    ahead_s = state.startup_s(settings.startup_prior_s) + window.window_s
    reason = (f"{state.ordered - fewer} replica(s) still starting no longer needed: {fewer} carry the upper forecast "
              f"{state.forecast.upper_per_s(ahead_s / window.window_s):.2f} requests/s {ahead_s:.0f} s ahead at "
              f"{headroom:.0%} of their capacity; cancelled before they serve")
    return _order(state, window, fewer, reason, verdict)


def _measured_floor(state: CapacityState, window: CapacityWindow) -> int:
    """The fewest replicas whose per-replica load stays within TRIM_STRETCH of a load measured to meet the SLO: the
    model's prior alone never sheds a replica (with nothing measured, nothing is trimmed)."""
    assert state.estimate is not None and state.forecast is not None
    if state.forecast.upper_per_s(1) <= 0:
        return 0  # nothing arrives: nothing to carry
    if state.estimate.met_factor is None:
        return state.ordered
    most = window.prior_per_replica * state.estimate.met_factor * TRIM_STRETCH
    return math.ceil(state.forecast.upper_per_s(1) / max(most, 1e-9) - 1e-9)


def _order(state: CapacityState, window: CapacityWindow, replicas: int, reason: str,
           verdict: str | None) -> CapacityPlan:
    assert state.estimate is not None
    step = ScaleStep(at_s=window.end_s, from_replicas=state.ordered, to_replicas=replicas,
                     predicted_per_replica=per_replica_capacity(state.estimate, window),
                     waiting_at_order=window.waiting_end)
    state = state.model_copy(update={"ordered": replicas, "last_step": step, "down_windows": 0, "trim_to": 0,
                                     "message": reason,
                                     "changes_at_s": (*(t for t in state.changes_at_s if window.end_s - t < 3600.0),
                                                      window.end_s)})
    return CapacityPlan(replicas, state, reason, verdict)


def _up_reason(state: CapacityState, window: CapacityWindow, target: int, need: int,
               settings: CapacitySettings) -> str:
    assert state.forecast is not None and state.estimate is not None
    ahead_s = state.startup_s(settings.startup_prior_s) + window.window_s
    capped = f" (needs {need}, maxReplicas is {settings.max_replicas})" if need > target else ""
    forecast = state.forecast.upper_per_s(ahead_s / window.window_s)
    return (f"{window.arrival_rate_per_s:.2f} requests/s arrived, {forecast:.2f} forecast {ahead_s:.0f} s ahead, "
            f"{window.waiting_end:.0f} queued: {target} replicas{capped} at "
            f"{per_replica_capacity(state.estimate, window):.2f} requests/s each, {state.estimate.describe()}")


def _hold_reason(state: CapacityState) -> str:
    assert state.estimate is not None
    at_rate = "; more are needed than maxReplicas allows at this rate" if state.infeasible_at_rate else ""
    return f"{state.ordered} replicas carry the forecast ({state.estimate.describe()}){at_rate}"
