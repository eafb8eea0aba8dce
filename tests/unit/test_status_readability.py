"""What a person reads in a TunedModel's status: conditions whose status, reason and message agree, MetricsAvailable
Unknown until a window was measured, rounded numbers, no repeated sentences, verdicts with effect size and interval."""

from __future__ import annotations

from datetime import UTC, datetime

from slotune.api import ConditionStatus, ConditionType, Phase
from slotune.api.status import Observed
from slotune.controller.status import Health, conditions, readable, readiness, status_body
from slotune.judge.verification import compare
from slotune.knobs import RuntimeConfig
from slotune.loop.state import TuningState
from slotune.snapshot import Histogram, LatencySummary


def deployment(wanted: int, ready: int, generation: int = 1, observed: int = 1, updated: int | None = None) -> dict:
    updated = ready if updated is None else updated
    return {"metadata": {"generation": generation}, "spec": {"replicas": wanted},
            "status": {"observedGeneration": observed, "replicas": wanted, "readyReplicas": ready,
                       "updatedReplicas": updated, "availableReplicas": ready}}


def by_type(state: TuningState, health: Health) -> dict:
    return {c.type: c for c in conditions(state, health, [], 1, datetime.now(UTC))}


def test_ready_is_the_pods_being_ready_and_says_the_same_numbers() -> None:
    assert readiness(None) == (False, "no Deployment yet")
    assert readiness(deployment(2, 2)) == (True, "2/2 pods ready")
    ready, message = readiness(deployment(1, 1, generation=2, observed=1))  # a change not yet seen: pods still serve
    assert ready and message.startswith("1/1 pods ready, rollout in progress")
    ready, message = readiness(deployment(2, 1))
    assert not ready and message.startswith("1/2 pods ready")
    state = TuningState.initial(RuntimeConfig()).evolve(phase=Phase.MEASURING)
    found = by_type(state, Health(ready=True, ready_message="2/2 pods ready"))[ConditionType.READY]
    assert (found.status, found.reason, found.message) == (ConditionStatus.TRUE, "PodsReady", "2/2 pods ready")


def test_metrics_available_is_unknown_until_a_window_was_measured() -> None:
    fresh = TuningState.initial(RuntimeConfig()).evolve(phase=Phase.MEASURING)
    metrics = by_type(fresh, Health(ready=True))[ConditionType.METRICS_AVAILABLE]
    assert (metrics.status, metrics.reason) == (ConditionStatus.UNKNOWN, "NoWindowYet")
    degraded = fresh.evolve(phase=Phase.DEGRADED, message="initial config failed: refused by the runtime policy: x")
    found = by_type(degraded, Health(ready=False))
    assert found[ConditionType.METRICS_AVAILABLE].status is ConditionStatus.UNKNOWN
    assert found[ConditionType.DEGRADED].reason == "PolicyRefused"
    measured = fresh.evolve(observed=Observed(window_s=30, num_requests=120))
    metrics = by_type(measured, Health(ready=True))[ConditionType.METRICS_AVAILABLE]
    assert (metrics.status, metrics.reason, metrics.message) == (ConditionStatus.TRUE, "WindowMeasured",
                                                                 "last window: 120 requests")


def test_messages_do_not_repeat_themselves() -> None:
    scheduler = '0/2 nodes are available: persistentvolumeclaim "models" not found. not found'
    assert readable(scheduler) == '0/2 nodes are available: persistentvolumeclaim "models" not found'
    assert readable("a. b. a.") == "a. b"
    state = TuningState.initial(RuntimeConfig()).evolve(phase=Phase.DEGRADED, message=f"initial config failed: pod "
                                                        f"p: unschedulable: {scheduler}")
    body = status_body(state, Health(ready=False), [], 1)
    assert not body["message"].endswith("not found. not found")
    degraded = next(c for c in body["conditions"] if c["type"] == "Degraded")
    assert degraded["message"].count("not found") == 1


def test_observed_numbers_are_rounded_for_people() -> None:
    observed = Observed(window_s=30.0000001, num_requests=10, prefix_cache_hit_rate=0.123456,
                        generation_tokens_per_s=412.345678).model_copy(
        update={"ttft": Observed.model_fields["ttft"].default.model_copy(update={"p99_ms": 7399.999999999999})})
    state = TuningState.initial(RuntimeConfig()).evolve(phase=Phase.MEASURING, observed=observed)
    shown = status_body(state, Health(ready=True), [], 1)["observed"]
    assert shown["ttft"]["p99"] == 7400.0 and shown["windowSeconds"] == 30.0
    assert shown["prefixCacheHitRate"] == 0.123 and shown["generationTokensPerSecond"] == 412.3


def _histogram(counts: tuple[float, ...]) -> LatencySummary:
    upper = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, float("inf"))
    histogram = Histogram(upper_s=upper, counts=counts)
    return LatencySummary(p50_ms=histogram.quantile_s(0.5) * 1000, p95_ms=histogram.quantile_s(0.95) * 1000,
                          p99_ms=histogram.quantile_s(0.99) * 1000, count=int(sum(counts)), histogram=histogram)


def test_a_verdict_states_the_effect_size_and_its_interval() -> None:
    before = _histogram((0, 0, 0, 0, 0, 0, 0, 100, 100, 0))  # seconds
    after = _histogram((150, 50, 0, 0, 0, 0, 0, 0, 0, 0))  # tens of milliseconds
    text = compare(before, after, 99, "ttft_p99").describe()
    # The tail test cannot decide here (nothing above the pooled P99's bucket), so no p-value stands in for the effect.
    assert text == "ttft_p99 9900.0 -> 49.0 ms (202x faster, interval x0.0025..x0.01)", text
    samples = compare(LatencySummary.from_samples([100.0 + i % 7 for i in range(200)]),
                      LatencySummary.from_samples([50.0 + i % 5 for i in range(200)]), 99, "tpot_p99")
    assert samples.improved and "x faster, interval x" in samples.describe(), samples.describe()


def test_too_few_requests_before_any_window_is_not_a_loss_of_metrics() -> None:
    from slotune.controller.events import transition_events
    from slotune.metrics.window import UnavailableReason

    start = TuningState.initial(RuntimeConfig()).evolve(phase=Phase.MEASURING)
    quiet = start.evolve(metrics_available=False, message="metrics unavailable, keeping the current config: "
                         "too-few-samples: 9 requests finished in 6 s, need 10")
    health = Health(ready=True, metrics_reason=UnavailableReason.TOO_FEW_SAMPLES)
    metrics = by_type(quiet, health)[ConditionType.METRICS_AVAILABLE]
    assert (metrics.status, metrics.reason) == (ConditionStatus.UNKNOWN, "TooFewSamples")
    assert "MetricsUnavailable" not in [r for r, _, _ in transition_events(start, quiet)]
    measured = start.evolve(observed=Observed(window_s=30, num_requests=120))
    lost = measured.evolve(metrics_available=False, message="Prometheus down")
    assert by_type(lost, health)[ConditionType.METRICS_AVAILABLE].status is ConditionStatus.FALSE
    assert ("MetricsUnavailable", "Prometheus down", True) in transition_events(measured, lost)


def test_prometheus_down_from_the_start_is_a_loss_of_metrics() -> None:
    from slotune.controller.events import transition_events

    start = TuningState.initial(RuntimeConfig()).evolve(phase=Phase.MEASURING)
    blind = start.evolve(metrics_available=False, message="metrics unavailable: unreachable: connection refused")
    assert "MetricsUnavailable" in [r for r, _, _ in transition_events(start, blind)]
