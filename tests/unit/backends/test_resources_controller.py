"""Pure parts of the operator around the children: rollout state, pod problems, conditions, events, settings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from slotune.api import Condition, ConditionStatus, ConditionType, Knob, Phase, Verdict
from slotune.backends.kube_pods import pod_problem, pod_ready, rollout_state
from slotune.controller.events import transition_events
from slotune.controller.status import Health, conditions, status_body
from slotune.knobs import RuntimeConfig
from slotune.loop.state import HistoryRecord, TuningState
from slotune.metrics.window import UnavailableReason
from slotune.settings import AdminTransport, load_settings
from slotune.snapshot import LatencyMetric


def deployment(generation: int = 2, observed: int = 2, wanted: int = 2, **status: int) -> dict:
    counts = {"replicas": wanted, "updatedReplicas": wanted, "readyReplicas": wanted,
              "availableReplicas": wanted} | status
    return {"metadata": {"generation": generation}, "spec": {"replicas": wanted},
            "status": {"observedGeneration": observed, **counts}}


@pytest.mark.parametrize(("case", "done"), [
    (deployment(), True),
    (deployment(observed=1), False),  # the controller has not seen the new template yet
    (deployment(updatedReplicas=1), False),
    (deployment(readyReplicas=1), False),
    (deployment(wanted=2, replicas=3), False),  # an old pod is still around
])
def test_rollout_is_done_only_when_every_replica_is_new_and_ready(case: dict, done: bool) -> None:
    assert rollout_state(case).done is done


def test_a_stalled_rollout_is_a_problem() -> None:
    stalled = deployment(readyReplicas=0)
    stalled["status"]["conditions"] = [{"type": "Progressing", "reason": "ProgressDeadlineExceeded", "message": "x"}]
    assert rollout_state(stalled).problem is not None


@pytest.mark.parametrize(("status", "transient"), [
    ({"containerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}, False),
    ({"containerStatuses": [{"state": {"running": {}}, "lastState": {"terminated": {"reason": "OOMKilled"}}}]}, False),
    ({"containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff", "message": "nope"}}}]}, False),
    ({"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                      "message": "0/2 nodes: Insufficient nvidia.com/gpu"}]}, True),
])
def test_pod_problems_are_named_and_only_unschedulable_may_pass(status: dict, transient: bool) -> None:
    found = pod_problem({"status": status})
    assert found is not None and found.transient is transient


def test_a_starting_pod_has_no_problem_and_is_not_ready() -> None:
    pod = {"metadata": {}, "status": {"containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}],
                                      "conditions": [{"type": "Ready", "status": "False"}]}}
    assert pod_problem(pod) is None
    assert not pod_ready(pod)
    pod["status"]["conditions"][0]["status"] = "True"
    assert pod_ready(pod)
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not pod_ready(pod)  # terminating pods get no config


def by_type(found: list[Condition]) -> dict[ConditionType, Condition]:
    return {c.type: c for c in found}


def test_conditions_follow_state_and_keep_their_transition_time() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    state = TuningState.initial(RuntimeConfig()).evolve(phase=Phase.TUNING, slo_met=False, metrics_available=True)
    first = by_type(conditions(state, Health(ready=True), [], 3, start))
    assert first[ConditionType.READY].status is ConditionStatus.TRUE
    assert first[ConditionType.SLO_MET].status is ConditionStatus.FALSE
    assert first[ConditionType.TUNING].status is ConditionStatus.TRUE
    assert first[ConditionType.DEGRADED].status is ConditionStatus.FALSE
    assert {c.observed_generation for c in first.values()} == {3}

    later = start + timedelta(minutes=5)
    blind = state.evolve(metrics_available=False, message="unreachable")
    health = Health(ready=True, metrics_reason=UnavailableReason.UNREACHABLE)
    second = by_type(conditions(blind, health, list(first.values()), 3, later))
    assert second[ConditionType.READY].last_transition_time == start  # unchanged status keeps its time
    metrics = second[ConditionType.METRICS_AVAILABLE]
    assert (metrics.status, metrics.reason, metrics.last_transition_time) == (
        ConditionStatus.FALSE, "PrometheusUnreachable", later)


def test_no_prometheus_and_tuning_off_have_their_own_reasons() -> None:
    state = TuningState.initial(RuntimeConfig()).evolve(phase=Phase.MEASURING)
    found = by_type(conditions(state, Health(ready=False, no_prometheus=True, tuning_enabled=False), [], 1,
                               datetime.now(UTC)))
    assert found[ConditionType.METRICS_AVAILABLE].reason == "NoPrometheus"
    assert found[ConditionType.TUNING].status is ConditionStatus.FALSE
    assert found[ConditionType.TUNING].reason == "Off"
    assert found[ConditionType.READY].status is ConditionStatus.FALSE


def test_status_body_is_wire_form_and_clears_stale_fields() -> None:
    state = TuningState.initial(RuntimeConfig(max_num_seqs=8)).evolve(phase=Phase.MEASURING)
    body = status_body(state, Health(ready=True), [], 1)
    assert body["phase"] == "Measuring"
    assert body["config"]["maxNumSeqs"] == 8
    assert body["observedGeneration"] == 1
    assert body["observed"] is None and body["diagnosis"] is None  # merge patch: null removes the old value


def record(verdict: Verdict, change: str = "max_num_seqs 1 -> 16") -> HistoryRecord:
    return HistoryRecord(iteration=2, time=datetime.now(UTC), knob=Knob.MAX_NUM_SEQS, change=change, reason="queue",
                         config=RuntimeConfig(max_num_seqs=16), verdict=verdict, detail="p99 TTFT 900 -> 120 ms")


def test_events_name_each_verdict_phase_and_metrics_loss() -> None:
    from slotune.loop.state import PendingChange

    before = TuningState.initial(RuntimeConfig()).evolve(phase=Phase.MEASURING)
    pending = PendingChange(config=RuntimeConfig(max_num_seqs=16), previous=RuntimeConfig(), knob=Knob.MAX_NUM_SEQS,
                            change="max_num_seqs 1 -> 16", reason="queue time dominates TTFT",
                            target_metric=LatencyMetric.TTFT, target_percentile=99)
    deciding = before.evolve(phase=Phase.TUNING, pending=pending)
    found = transition_events(before, deciding)
    assert ("ChangeDecided", "trying max_num_seqs 1 -> 16: queue time dominates TTFT", False) in found
    kept = deciding.record(record(Verdict.KEPT)).evolve(pending=None, phase=Phase.MEASURING)
    reasons = [r for r, _, _ in transition_events(deciding, kept)]
    assert reasons[0] == "ChangeKept"
    rolled = kept.record(record(Verdict.ROLLED_BACK, "max_num_batched_tokens 256 -> 512"))
    (event,) = [e for e in transition_events(kept, rolled) if e[0] == "ChangeRolledBack"]
    assert event[2] is True and "256 -> 512" in event[1]
    blind = rolled.evolve(metrics_available=False, message="Prometheus down")
    assert ("MetricsUnavailable", "Prometheus down", True) in transition_events(rolled, blind)
    assert transition_events(blind, blind) == []  # nothing happened, nothing said


def test_settings_come_from_env_and_flags_win(tmp_path: Path) -> None:
    environ = {"SLOTUNE_PROMETHEUS_URL": "http://prom:9090", "SLOTUNE_WATCH_NAMESPACES": "a, b,,",
               "SLOTUNE_ADMIN_TRANSPORT": "proxy", "SLOTUNE_TICK_S": "0.5"}
    settings = load_settings({"prometheus_url": "http://flag:9090", "peering": None}, environ)
    assert settings.prometheus_url == "http://flag:9090"
    assert settings.watch_namespaces == ("a", "b")
    assert settings.admin_transport is AdminTransport.PROXY
    assert settings.tick_s == 0.5 and settings.peering == "slotune"
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text('{"ns/pod-0": "http://127.0.0.1:1234"}')
    assert load_settings({"pod_endpoints_file": str(endpoints)}, {}).pod_endpoints() == {
        "ns/pod-0": "http://127.0.0.1:1234"}
    with pytest.raises(ValueError, match="SLOTUNE_LOG_LEVEL"):
        load_settings({}, {"SLOTUNE_LOG_LEVEL": "LOUD"})
