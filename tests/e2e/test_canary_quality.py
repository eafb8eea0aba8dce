"""A change that alters outputs (8-bit weights), verified as a canary on real runtime pods: the quality gate probes
the canary pod alone, by its own endpoint, and is judged first. With a bound it breaks, the change is rolled back on
the canary pod before any latency window, and the sibling never serves it (nor any of the candidate's probes: the
per-pod request counters show the probe set went to the canary pod alone). With bounds it holds, its latency is
then judged canary-vs-siblings over the same window, and the verdict says Canary. A weights change the pods cannot
take live (hotReconfigure off) is canaried the same way on one extra pod of its own Deployment.

The operator's own run (slotune.controller.run.TuningRun: the Kubernetes backend, the per-pod PromQL source, the
status store, the Tuner) is ticked by the test, with a known change as the loop's intent (so which change is tried
is not up to the policy) and its gate recording in the tick (`inline`) rather than on a thread, so the per-pod
request counts read between ticks are exact. Control plane, Prometheus and runtime processes are real (the tiny
random-weight model, fp32 vs int8: its answers drift, and the bounds are set to pass or fail on that).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from slotune.api import parse_tunedmodel
from slotune.api.quality import QualitySpec
from slotune.api.status import Phase
from slotune.api.tuning import Knob
from slotune.backends.kube_api import KubeAPI
from slotune.backends.kube_canary_pod import canary_deployment_name
from slotune.controller.run import TuningRun, deploy
from slotune.controller.windows import SharedWindows
from slotune.knobs import Quantization, RuntimeConfig
from slotune.loop import TuningState
from slotune.loop.state import PendingChange
from slotune.quality import QualityGate
from slotune.quality.gate import inline
from slotune.quality.probe_set import PROBES
from slotune.settings import OperatorSettings
from slotune.snapshot import LatencyMetric, LatencySummary, MetricsSnapshot, Source
from slotune.workload import WorkloadSpec
from tests.e2e.harness.kube import apply, get, install_tunedmodel_crd, scratch_namespace, wait_for
from tests.e2e.harness.kubelet import KubeletStandIn
from tests.e2e.harness.load import Load, Shape
from tests.e2e.test_canary_pods import WORKLOAD, tunedmodel

NAME = "canary-quality"
BREAKS = QualitySpec(min_token_agreement=1.0, min_top1_agreement=1.0, max_mean_kl=0.0, probe_max_tokens=8)
HOLDS = QualitySpec(min_token_agreement=0.0, min_top1_agreement=0.0, max_mean_kl=10.0, probe_max_tokens=8)
_SUCCESS = re.compile(r"^vllm:request_success_total(?:\{[^}]*\})? ([0-9.e+]+)$", re.MULTILINE)


@pytest.fixture
def namespace(kube) -> Iterator[str]:
    install_tunedmodel_crd(kube)
    with scratch_namespace(kube, "canaryq") as name:
        yield name


def served(url: str) -> int:
    """Requests a runtime finished, from its own /metrics."""
    return round(sum(float(n) for n in _SUCCESS.findall(httpx.get(f"{url}/metrics", timeout=30).text)))


def intent(running: RuntimeConfig) -> TuningState:
    """The loop's state just after deciding on int8 weights (a baseline window behind it), not yet applied."""
    change = PendingChange(config=running.with_changes(quantization=Quantization.INT8), previous=running,
                           knob=Knob.QUANTIZATION, change="quantization none -> int8", reason="the test's change",
                           target_metric=LatencyMetric.TTFT, target_percentile=99)
    baseline = MetricsSnapshot(Source.PROMETHEUS, 5.0, 100, ttft=LatencySummary.from_samples([400.0] * 100))
    return TuningState(phase=Phase.TUNING, current=running, pending=change, baseline=baseline, changes_applied=0,
                       tried_keys=frozenset({running.key()}))


def test_an_output_altering_canary_is_judged_on_quality_first_on_the_canary_pod(kube, namespace, prometheus,
                                                                                 model_cache, tmp_path) -> None:
    server = prometheus(scrape_interval_s=0.5)
    kubelet = KubeletStandIn(kube.api_client(), namespace, NAME, server, tmp_path).start()
    settings = OperatorSettings(prometheus_url=server.url, pod_endpoints_file=kubelet.endpoints_file,
                                rollout_timeout_s=300)
    api = KubeAPI.from_environment(str(kube.kubeconfig))
    load = Load(kubelet.urls, WorkloadSpec.model_validate(WORKLOAD), Shape(clients=WORKLOAD["concurrency"]))
    try:
        run, fp32 = start(kube, api, settings, kubelet, tunedmodel(namespace, NAME, tuning=TUNING), pods=2)
        urls = {pod: entry.process.url for pod, entry in kubelet.pods.items()}

        # A bound int8 breaks: rolled back on the canary pod, judged before any latency window.
        run.tuner.quality = QualityGate(BREAKS, run._openai_urls, "tiny", submit=inline)
        run.store.save(intent(fp32))
        counts = {pod: served(url) for pod, url in urls.items()}
        state = tick_until(run, kubelet, lambda s: s.pending is not None and s.pending.applied, "the canary started")
        assert state.pending is not None and state.pending.canary_pod in urls, state
        canary = state.pending.canary_pod
        (sibling,) = [pod for pod in urls if pod != canary]
        assert state.pending.canary_endpoint == urls[canary]
        assert quantization(kubelet) == {canary: "int8", sibling: "none"}
        probes = {pod: served(url) - counts[pod] for pod, url in urls.items()}
        # The reference went over both pods (half each); the candidate's probe set to the canary pod alone.
        assert probes == {canary: len(PROBES) // 2 + len(PROBES), sibling: len(PROBES) // 2}, probes
        state = tick_until(run, kubelet, lambda s: bool(s.history), "the quality verdict")
        rolled_back_first(state)
        tick_until(run, kubelet, lambda s: s.rollout is None and quantization(kubelet) == dict.fromkeys(urls, "none"),
                   "the canary pod back on fp32")
        assert {pod: served(url) - counts[pod] for pod, url in urls.items()} == probes  # nothing more was asked

        # Bounds int8 holds: then judged on latency, canary against sibling over the same window.
        run.tuner.quality = QualityGate(HOLDS, run._openai_urls, "tiny", submit=inline)
        run.store.save(intent(fp32))
        load.start()
        state = tick_until(run, kubelet, lambda s: s.pending is not None and s.pending.applied,
                           "the second canary started")
        assert state.pending is not None
        canary = state.pending.canary_pod
        assert quantization(kubelet) == {pod: "int8" if pod == canary else "none" for pod in urls}
        state = tick_until(run, kubelet, lambda s: bool(s.history), "the latency verdict")
        entry = state.history[0]
        assert entry.verification is not None and entry.verification.value == "Canary", entry
        assert entry.detail.startswith("canary verification") and "quality holds" in entry.detail, entry
        final = "int8" if entry.verdict.value == "Kept" else "none"
        tick_until(run, kubelet, lambda s: s.rollout is None and set(quantization(kubelet).values()) == {final},
                   "every pod on the verdict's config")
    finally:
        load.stop()
        api.close()
        kubelet.stop()


def test_a_weights_change_that_needs_a_restart_is_judged_on_quality_on_its_extra_pod(kube, namespace, prometheus,
                                                                                     model_cache, tmp_path) -> None:
    server = prometheus(scrape_interval_s=0.5)
    kubelet = KubeletStandIn(kube.api_client(), namespace, NAME, server, tmp_path).start()
    settings = OperatorSettings(prometheus_url=server.url, pod_endpoints_file=kubelet.endpoints_file,
                                rollout_timeout_s=300)
    api = KubeAPI.from_environment(str(kube.kubeconfig))
    # hotReconfigure off: int8 needs a restart; maxReplicas 2 leaves room for one extra pod beside the one replica.
    manifest = tunedmodel(namespace, NAME, replicas=1, tuning={
        **TUNING, "hotReconfigure": False, "bounds": {"minReplicas": 1, "maxReplicas": 2}})
    try:
        run, fp32 = start(kube, api, settings, kubelet, manifest, pods=1)
        ((main, main_url),) = [(pod, entry.process.url) for pod, entry in kubelet.pods.items()]
        run.tuner.quality = QualityGate(BREAKS, run._openai_urls, "tiny", submit=inline)
        run.store.save(intent(fp32))
        before = served(main_url)
        state = tick_until(run, kubelet, lambda s: s.pending is not None and s.pending.applied,
                           "the extra canary pod started")
        assert state.pending is not None and state.pending.canary_pod not in (None, main), state
        extra = state.pending.canary_pod
        assert state.pending.canary_endpoint == kubelet.pods[extra].process.url
        assert quantization(kubelet) == {main: "none", extra: "int8"}
        assert get(kube, "deployment", canary_deployment_name(NAME), namespace) is not None
        assert served(main_url) - before == len(PROBES)  # the reference; the candidate's probes went to the extra pod
        assert served(kubelet.pods[extra].process.url) == len(PROBES)
        state = tick_until(run, kubelet, lambda s: bool(s.history), "the quality verdict")
        rolled_back_first(state)
        wait_for(lambda: get(kube, "deployment", canary_deployment_name(NAME), namespace) is None, 120,
                 "the canary Deployment deleted")
        tick_until(run, kubelet, lambda s: s.rollout is None and quantization(kubelet) == {main: "none"},
                   "the main pod alone, on fp32")
        assert served(main_url) - before == len(PROBES)
    finally:
        api.close()
        kubelet.stop()


TUNING = {"knobs": ["quantization"], "allowQualityChange": True, "windowSeconds": 5, "minSamples": 10,
          "warmupSeconds": 1, "cooldownSeconds": 0, "maxIterations": 1}


def start(kube, api: KubeAPI, settings: OperatorSettings, kubelet: KubeletStandIn, manifest: dict[str, Any],
          pods: int) -> tuple[TuningRun, RuntimeConfig]:  # type: ignore[no-untyped-def]
    """Deploy the TunedModel's children, wait for its pods to serve, and the operator's run for it (not ticking)."""
    apply(kube, manifest)
    tm = parse_tunedmodel(get(kube, "tunedmodel", NAME, manifest["metadata"]["namespace"]))
    running = deploy(api, tm, settings, restart_tuning=True)
    wait_for(lambda: len(kubelet.urls()) == pods, 180, "the pods serving", describe=lambda: f"{kubelet.errors}")
    return TuningRun(api, tm, settings, SharedWindows()), running


def tick_until(run: TuningRun, kubelet: KubeletStandIn, done: Callable[[TuningState], bool],
               what: str) -> TuningState:
    """Tick the operator's run (as its daemon would) until its saved state is `done`."""
    def ticked() -> TuningState | None:
        run.tick()
        state = run.store.last()
        return state if state is not None and done(state) else None
    return wait_for(ticked, 300, what, describe=lambda: (
        f"{run.store.last()}\nlive: {kubelet.live_configs()}\n{kubelet.errors}"))


def quantization(kubelet: KubeletStandIn) -> dict[str, str]:
    """Each serving pod's live weight quantization, read from the pod (GET /admin/config)."""
    return {pod: live["quantization"] for pod, live in kubelet.live_configs().items()}


def rolled_back_first(state: TuningState) -> None:
    """The history's verdict: rolled back, as a canary, on quality, before any latency window was judged."""
    entry = state.history[0]
    assert entry.verdict.value == "RolledBack" and entry.verification is not None, entry
    assert entry.verification.value == "Canary" and "quality judged first" in entry.detail, entry
    assert "token agreement" in entry.detail and state.measured.observed is None  # no latency window was judged
