"""A change that can alter outputs, verified as a canary (slotune.loop.canary.quality_first, its hooks in loop.tuner
and loop.verify):
the quality gate probes the canary pod alone (the Service would mix both configs' answers), and is judged before
any latency window, so a change that breaks quality goes back on the canary pod without a window being read; one
that holds is then judged on latency canary-vs-siblings. A backend that cannot name the canary pod's endpoint
verifies such a change before/after."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from slotune.api.quality import QualitySpec
from slotune.api.status import Phase, Verdict, Verification
from slotune.api.tuning import Knob, TuningSpec
from slotune.knobs import Quantization, RuntimeConfig
from slotune.loop import MemoryStateStore, Tuner, TuningProblem, TuningState
from slotune.loop.state import PendingChange
from slotune.perfmodel import Deployment
from slotune.quality.gate import QualityGate, in_background
from slotune.quality.record import QualityRecord
from slotune.snapshot import LatencyMetric
from tests.unit.canary_pods import PODS, CanaryPods, window
from tests.unit.loop.test_loop_canary import SLO
from tests.unit.quality.test_quality_gate import _record

OLD = RuntimeConfig(max_num_seqs=4, replicas=3)
INT8 = OLD.with_changes(quantization=Quantization.INT8)
URLS = [f"http://{pod}" for pod in PODS]
REFERENCE, HOLDS, BREAKS = _record(0.9), _record(0.89), _record(0.3)  # KL 0.0003 holds, 0.64 breaks maxMeanKl


class Recorder:
    """The probe recorder: which endpoints each recording asked, and the given answers in order (the last one
    again for any later change the loop decides on)."""

    def __init__(self, *records: QualityRecord) -> None:
        self.records = list(records)
        self.asked: list[list[str]] = []

    def __call__(self, urls: Sequence[str], model: str, max_tokens: int) -> QualityRecord:
        self.asked.append(list(urls))
        return self.records.pop(0) if len(self.records) > 1 else self.records[0]


def _pods(canary_scale: float = 0.5, endpoint: str | None = "http://p0") -> CanaryPods:
    """Three replicas; the canary runs on p0 and its endpoint is http://p0 (None: the backend names none)."""
    return CanaryPods(OLD, canary_scale=canary_scale, endpoint=endpoint)


def _tuner(pods: CanaryPods, gate: QualityGate) -> Tuner:
    h100 = Deployment.from_names("llama-3.1-8b", "h100")
    tuning = TuningSpec(cooldown_s=0, min_samples=10, knobs=[Knob.QUANTIZATION], allow_quality_change=True)
    store = MemoryStateStore()
    pending = PendingChange(config=INT8, previous=OLD, knob=Knob.QUANTIZATION, change="quantization none -> int8",
                            reason="decode-bound", target_metric=LatencyMetric.TTFT, target_percentile=99)
    store.save(TuningState(phase=Phase.TUNING, current=OLD, pending=pending, baseline=window(1.0, 600, 0),
                           tried_keys=frozenset({OLD.key()})))
    return Tuner(TuningProblem(SLO, tuning, h100, OLD), pods, pods, store, quality=gate)


def test_a_change_that_breaks_quality_is_rolled_back_on_the_canary_pod_before_anywindow() -> None:
    pods, recorder = _pods(), Recorder(REFERENCE, BREAKS)
    tuner = _tuner(pods, QualityGate(QualitySpec(), lambda: URLS, "m", recorder=recorder))
    state = tuner.step()  # the reference over every pod, then the canary, whose probe set goes to p0 alone
    assert state.pending is not None and state.pending.canary_pod == "p0" and state.pending.canary_endpoint
    assert pods.configs == {"p0": INT8, "p1": OLD, "p2": OLD}
    assert recorder.asked == [URLS, ["http://p0"]]
    state = tuner.step()
    assert pods.windows == 0  # no latency window was read: quality is judged first
    entry = state.history[0]
    assert entry.verdict is Verdict.ROLLED_BACK and entry.verification is Verification.CANARY
    assert "quality judged first" in entry.detail and "mean KL" in entry.detail
    p0 = pods.ran["p0"]
    assert OLD in p0[p0.index(INT8):]  # the canary pod went back to the previous config
    assert set(pods.ran["p1"] + pods.ran["p2"]) == {OLD}  # the siblings never ran anything else
    assert state.to_status().history[0].verification is Verification.CANARY
    # The next change (fp8 weights) is decided from the baseline window at once, and is itself a canary on p0.
    assert state.pending is not None and state.pending.config.quantization is Quantization.FP8
    assert pods.configs == {"p0": state.pending.config, "p1": OLD, "p2": OLD}


def test_a_change_whose_quality_holds_is_then_judged_on_latency_as_a_canary() -> None:
    pods, recorder = _pods(canary_scale=0.5), Recorder(REFERENCE, HOLDS)
    tuner = _tuner(pods, QualityGate(QualitySpec(), lambda: URLS, "m", recorder=recorder))
    tuner.step()
    state = tuner.step()  # the gate holds: the canary window is judged, the canary faster than its siblings
    assert pods.windows == 1 and recorder.asked == [URLS, ["http://p0"]]
    (entry,) = state.history
    assert entry.verdict is Verdict.KEPT and entry.verification is Verification.CANARY
    assert entry.detail.startswith("canary verification") and "quality holds" in entry.detail
    assert state.current == INT8 and pods.configs == dict.fromkeys(PODS, INT8)


def test_no_window_is_read_while_the_canary_pods_probe_runs() -> None:
    release = threading.Event()

    def slow(urls: Sequence[str], model: str, max_tokens: int) -> QualityRecord:
        if urls == ["http://p0"]:
            assert release.wait(60), "the test never let the probe finish"
            return BREAKS
        return REFERENCE

    pods = _pods()
    tuner = _tuner(pods, QualityGate(QualitySpec(), lambda: URLS, "m", recorder=slow, submit=in_background))
    while (state := tuner.step()).pending is not None and not state.pending.applied:
        threading.Event().wait(0.01)  # the reference, recorded in the background
    for _ in range(3):
        state = tuner.step()
        assert "still running on canary pod p0" in state.message and pods.windows == 0 and not state.history
    release.set()
    while not (state := tuner.step()).history:
        threading.Event().wait(0.01)
    assert state.history[0].verdict is Verdict.ROLLED_BACK and pods.windows == 0


def test_a_lost_reference_is_recorded_from_the_sibling_pods() -> None:
    recorder = Recorder(REFERENCE, HOLDS)
    gate = QualityGate(QualitySpec(), lambda: URLS, "m", recorder=recorder)  # a fresh operator: no reference
    verdict = gate.check(OLD, INT8, on="http://p0/")
    assert verdict is not None and verdict.keep
    assert recorder.asked == [["http://p1", "http://p2"], ["http://p0/"]]


def test_without_the_canary_pods_endpoint_an_output_altering_change_is_verified_before_after() -> None:
    pods, recorder = _pods(endpoint=None), Recorder(REFERENCE, HOLDS)
    tuner = _tuner(pods, QualityGate(QualitySpec(), lambda: URLS, "m", recorder=recorder))
    state = tuner.step()
    assert state.pending is not None and state.pending.canary_pod is None and pods.canary is None
    assert pods.configs == dict.fromkeys(PODS, INT8) and recorder.asked == [URLS, URLS]
    state = tuner.step()
    assert state.history[0].verification is Verification.BEFORE_AFTER
