"""The loop's canary path (slotune.loop.canary, hooks in loop.apply and loop.verify): a live change with two or more
replicas goes to
one replica, the canary window is judged canary-vs-siblings, and the change is promoted to every replica or rolled
back on the canary alone; with one replica, or a backend without canaries, before/after as ever."""

from __future__ import annotations

from slotune.api.status import Phase, Verdict, Verification
from slotune.api.tuning import Knob, TuningSpec
from slotune.controller.status import Health, status_body
from slotune.knobs import RuntimeConfig
from slotune.loop import MemoryStateStore, Tuner, TuningProblem, TuningState
from slotune.loop.state import PendingChange
from slotune.metrics.per_pod import ArmWindows
from slotune.metrics.window import MetricsUnavailable, UnavailableReason
from slotune.perfmodel import Deployment
from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric
from tests.unit.canary_pods import CanaryPods, window

SLO = SLOSpec.model_validate({"ttft": {"p99": 300}})
OLD = RuntimeConfig(max_num_seqs=4, replicas=3)
NEW = OLD.with_changes(max_num_seqs=32)


def _pods(**kwargs: object) -> CanaryPods:
    return CanaryPods(OLD, **kwargs)  # type: ignore[arg-type]


def _tuner(pods: CanaryPods) -> tuple[Tuner, MemoryStateStore]:
    h100 = Deployment.from_names("llama-3.1-8b", "h100")
    problem = TuningProblem(SLO, TuningSpec(cooldown_s=0, min_samples=10), h100, OLD)
    store = MemoryStateStore()
    pending = PendingChange(config=NEW, previous=OLD, knob=Knob.MAX_NUM_SEQS, change="maxNumSeqs 4 -> 32",
                            reason="queueing", target_metric=LatencyMetric.TTFT, target_percentile=99)
    store.save(TuningState(phase=Phase.TUNING, current=OLD, pending=pending, baseline=window(1.0, 600, 0),
                           tried_keys=frozenset({OLD.key()})))
    return Tuner(problem, pods, pods, store), store


def test_a_faster_canary_is_promoted_to_every_pod() -> None:
    pods = _pods(canary_scale=0.5)
    tuner, _ = _tuner(pods)
    state = tuner.step()  # the change goes to the canary pod only
    assert state.pending is not None and state.pending.canary_pod == "p0"
    assert pods.configs == {"p0": NEW, "p1": OLD, "p2": OLD}
    assert "canary pod p0" in state.message and state.running == OLD  # the status' config: what the siblings run
    status = state.to_status()
    assert status.config == OLD and status.canary is not None and (status.canary.pod, status.canary.config) == (
        "p0", NEW)
    assert status_body(state, Health(ready=True), [], 1)["canary"]["pod"] == "p0"
    state = tuner.step()  # the canary window: promoted
    assert state.pending is None and state.current == NEW
    assert pods.configs == dict.fromkeys(pods.configs, NEW) and pods.canary is None
    (entry,) = state.history
    assert entry.verdict is Verdict.KEPT and entry.detail.startswith("canary verification")
    assert entry.verification is Verification.CANARY and state.to_status().canary is None
    # The status is merge-patched: a canary that ended is written as null, never left standing.
    body = status_body(state, Health(ready=True), [], 1)
    assert "canary" in body and body["canary"] is None


def test_a_slower_canary_is_rolled_back_on_the_canary_alone() -> None:
    pods = _pods(canary_scale=1.5)
    tuner, _ = _tuner(pods)
    tuner.step()
    sent: list[dict[str, RuntimeConfig]] = []
    apply = pods.apply
    pods.apply = lambda config: (sent.append(dict(pods.configs)), apply(config))[1]  # type: ignore[method-assign]
    state = tuner.step()
    assert state.current == OLD and pods.configs["p1"] == pods.configs["p2"] == OLD
    assert all(before["p1"] == before["p2"] == OLD for before in sent)  # the siblings never changed
    assert OLD in [before["p0"] for before in sent[1:]]  # the canary pod went back to the old config
    # The next change is decided from the baseline window at once, and is itself a canary on p0.
    assert state.pending is None or state.pending.canary_pod == "p0"
    (entry, *_) = state.history
    assert entry.verdict is Verdict.ROLLED_BACK and "canary worse than its siblings" in entry.detail
    assert entry.verification is Verification.CANARY


def test_one_replica_is_verified_before_after() -> None:
    pods = _pods()
    pods.start_canary = lambda running, candidate: None  # type: ignore[method-assign]  # the backend declines
    tuner, _ = _tuner(pods)
    state = tuner.step()
    assert state.pending is not None and state.pending.canary_pod is None and state.running == NEW
    assert pods.configs == dict.fromkeys(pods.configs, NEW) and state.to_status().canary is None
    state = tuner.step()
    assert state.history[0].verification is Verification.BEFORE_AFTER


def test_a_canary_whose_pod_vanished_starts_again_and_is_then_judged() -> None:
    pods = _pods(canary_scale=0.5)
    tuner, _ = _tuner(pods)
    tuner.step()
    arms = pods.arms

    def replaced(canary_pod: str) -> ArmWindows:
        pods.arms = arms  # type: ignore[method-assign]  # the next window has both arms again
        raise MetricsUnavailable(UnavailableReason.NOT_EXPOSED, "no per-pod series of the canary pod p0")

    pods.arms = replaced  # type: ignore[method-assign]
    state = tuner.step()
    assert "canary lost" in state.message and state.pending is not None and not state.pending.applied
    assert pods.canary is None and state.changes_applied == 0 and not state.history
    state = tuner.step()  # applied again, on a ready pod
    assert state.pending is not None and state.pending.canary_pod == "p0" and state.changes_applied == 1
    state = tuner.step()
    assert state.current == NEW and state.history[-1].verification is Verification.CANARY
