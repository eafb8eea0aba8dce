"""A change that needs a restart (hotReconfigure off) canaried as one extra pod on real runtime pods: the candidate
runs in its own Deployment `<name>-canary` (one replica, the candidate's pod template, the labels the Service
selects), beside the main pod, which is never touched while the canary runs; per-pod PromQL over the same window
judges the extra pod against the main one. Promoted once (the canary Deployment goes, the main Deployment rolls to
the candidate) and rolled back once (the canary Deployment goes alone); every pod's live config (`GET
/admin/config`) is read back after each step. A new backend object mid-canary (what an operator restart makes)
finds the same canary pod and starts nothing; the main Deployment's pod list and Ready count never include the
extra pod; deleting the TunedModel garbage-collects a canary Deployment.

As in test_canary_pods, the test plays the loop's part (start, judge, end, apply); the backend, the per-pod reads
and the decision rule are the operator's own, the control plane, Prometheus and runtime processes real.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from slotune.api import parse_tunedmodel
from slotune.backends.kube_api import KubeAPI
from slotune.backends.kube_canary_pod import CANARY_POD_LABEL, canary_deployment_name
from slotune.backends.kube_deployment import KubernetesBackend
from slotune.controller.run import deploy
from slotune.controller.status import readiness
from slotune.judge.canary import CanaryOutcome, CanaryVerdict
from slotune.judge.canary_pool import MAX_LOOKS, judge_pooled, pooled
from slotune.knobs import RuntimeConfig
from slotune.metrics.names import names_for
from slotune.metrics.per_pod import ArmWindows, arm_windows
from slotune.metrics.promql import Selector
from slotune.metrics.window import MetricsUnavailable
from slotune.settings import OperatorSettings
from slotune.snapshot import LatencyMetric
from slotune.workload import WorkloadSpec
from tests.e2e import test_canary_pods as canary_pods
from tests.e2e.harness.kube import apply, get, install_tunedmodel_crd, scratch_namespace, wait_for, wait_for_progress
from tests.e2e.harness.kubelet import KubeletStandIn
from tests.e2e.harness.load import Load, Shape
from tests.e2e.harness.operator import OperatorProcess
from tests.e2e.harness.pods import live_seqs, seqs, settle
from tests.e2e.test_canary_pods import ARM_REQUESTS, TTFT_P99_MS, WORKLOAD

NAME = "extra"
CANARY = canary_deployment_name(NAME)


def tunedmodel(namespace: str) -> dict[str, Any]:
    # hotReconfigure off: every change needs a restart; maxReplicas 2 leaves room for one extra pod.
    return canary_pods.tunedmodel(namespace, NAME, replicas=1, tuning={
        "mode": "off", "windowSeconds": 5, "minSamples": 10, "hotReconfigure": False,
        "bounds": {"minReplicas": 1, "maxReplicas": 2}})


@pytest.fixture
def namespace(kube) -> Iterator[str]:
    install_tunedmodel_crd(kube)
    with scratch_namespace(kube, "canary-extra") as name:
        yield name


def test_a_restart_change_is_canaried_on_one_extra_pod(kube, namespace, prometheus, model_cache, tmp_path) -> None:
    server = prometheus()
    kubelet = KubeletStandIn(kube.api_client(), namespace, NAME, server, tmp_path).start()
    settings = OperatorSettings(pod_endpoints_file=kubelet.endpoints_file, rollout_timeout_s=300)
    api = KubeAPI.from_environment(str(kube.kubeconfig))
    selector = Selector(namespace=namespace, deployment=f"{NAME}-runtime", model="tiny")
    load = Load(kubelet.urls, WorkloadSpec.model_validate(WORKLOAD), Shape(clients=WORKLOAD["concurrency"]))

    def live() -> dict[str, int]:
        return live_seqs(kubelet)

    def describe() -> str:
        return f"pods: {live()}; kubelet errors: {kubelet.errors}"

    def canary_window(pod: str) -> ArmWindows:
        """Both arms over the same window, from now until each finished ARM_REQUESTS requests (progress, no clock)."""
        start_s = time.time()
        found: list[ArmWindows] = []

        def least() -> int:
            try:
                found[:] = [arm_windows(server.url, names_for("builtin"), selector, pod, time.time() - start_s,
                                        time.time())]
            except MetricsUnavailable:
                return 0
            return min(found[0].canary.num_requests, found[0].baseline.num_requests)

        wait_for_progress(least, ARM_REQUESTS, 180, "requests in both arms of the canary window", describe=describe)
        return found[0]

    def one_main_pod(backend: KubernetesBackend, max_num_seqs: int, gone: set[str]) -> str:
        """The main Deployment's one pod once it is Ready in the API and serving at `max_num_seqs`, none of `gone`
        among the serving pods. The kubelet's view and the API's settle at their own pace on a busy machine, so this
        waits for both to agree rather than reading either once."""

        def agreed() -> str | None:
            serving, ready = live(), [p["metadata"]["name"] for p in backend.ready_pods()]
            if len(ready) == 1 and serving == {ready[0]: max_num_seqs} and not gone & set(serving):
                return ready[0]
            return None

        def seen() -> str:
            return f"{describe()}; Ready in the API: {[p['metadata']['name'] for p in backend.ready_pods()]}"

        return wait_for(agreed, 180, f"one main pod, Ready and serving at max_num_seqs={max_num_seqs}", describe=seen)

    def run_canary(backend: KubernetesBackend, running: RuntimeConfig, candidate: RuntimeConfig,
                   tm_slo: Any) -> tuple[str, str, CanaryVerdict]:
        main = one_main_pod(backend, running.max_num_seqs, set())
        restarts = kubelet.started_total
        started = settle(lambda: backend.start_canary(running, candidate).result)  # type: ignore[union-attr]
        assert started.ok, started.reason
        pod = backend.start_canary(running, candidate).pod  # type: ignore[union-attr]
        assert pod and pod != main
        wait_for(lambda: set(live()) == {main, pod}, 180, "the extra pod serving", describe=describe)
        assert seqs(kubelet) == {main: running.max_num_seqs, pod: candidate.max_num_seqs}
        assert kubelet.started_total == restarts + 1  # one new process, the extra pod's; the main pod untouched
        canary = get(kube, "deployment", CANARY, namespace)
        assert canary["spec"]["replicas"] == 1 and canary["spec"]["template"]["metadata"]["labels"][
            CANARY_POD_LABEL] == "true"
        (owner,) = canary["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("TunedModel", NAME)
        # The main Deployment's pods and Ready count leave the extra pod out.
        assert [p["metadata"]["name"] for p in backend.ready_pods()] == [main]
        assert readiness(backend.deployment())[1].startswith("1/1 pods ready")
        # An operator restarted mid-canary (a new backend object, nothing in memory) finds the same pod.
        again = KubernetesBackend(api, backend.tm, settings).start_canary(running, candidate)
        assert again is not None and again.result.ok and again.pod == pod
        # Judged as the loop judges it: both arms pooled over up to MAX_LOOKS windows (slotune.judge.canary_pool). One
        # window's P99 test cannot show "better" on ~60 requests an arm (0 exceedances of 60 has p ~ 0.55 at 1%).
        pool = None
        for _ in range(MAX_LOOKS):
            arms = canary_window(pod)
            assert arms.baseline_pods == (main,)
            assert seqs(kubelet)[main] == running.max_num_seqs and kubelet.started_total == restarts + 1
            verdict, pool, final = judge_pooled(pooled(pool, arms.baseline, arms.canary), LatencyMetric.TTFT, 99,
                                                tm_slo)
            if final:
                break
        return main, pod, verdict

    try:
        apply(kube, tunedmodel(namespace))
        tm = parse_tunedmodel(get(kube, "tunedmodel", NAME, namespace))
        deploy(api, tm, settings, restart_tuning=True)
        backend = KubernetesBackend(api, tm, settings)
        slow = tm.spec.initial_config()
        assert settle(lambda: backend.apply(slow)).ok
        one_main_pod(backend, slow.max_num_seqs, set())
        load.start()

        # A better candidate on the extra pod: promoted; the canary Deployment goes, the main one rolls to it.
        fast = slow.with_changes(max_num_seqs=16)
        main, pod, verdict = run_canary(backend, slow, fast, tm.spec.slo)
        assert verdict.outcome is CanaryOutcome.PROMOTE, verdict.reason
        backend.end_canary()
        assert get(kube, "deployment", CANARY, namespace) is None
        launched = kubelet.started_total
        assert settle(lambda: backend.apply(fast)).ok
        # One main pod, relaunched at the promoted config, and no extra pod: one process started, no second rollout.
        main = one_main_pod(backend, fast.max_num_seqs, {main, pod})
        assert kubelet.started_total == launched + 1, describe()

        # A worse candidate on the extra pod: rolled back, the canary Deployment goes alone.
        restarts = kubelet.started_total
        main_again, _, verdict = run_canary(backend, fast, slow, tm.spec.slo)
        assert main_again == main
        assert verdict.outcome is CanaryOutcome.WORSE, verdict.reason
        backend.end_canary()
        assert get(kube, "deployment", CANARY, namespace) is None
        assert settle(lambda: backend.apply(fast)).ok
        wait_for(lambda: live() == {main: 16}, 180, "the main pod alone, untouched", describe=describe)
        assert kubelet.started_total == restarts + 1  # the extra pod's process only

        # A canary Deployment is garbage-collected with its TunedModel.
        assert backend.start_canary(fast, slow) is not None
        assert get(kube, "deployment", CANARY, namespace) is not None
        load.stop()
        kube.kubectl("delete", "tunedmodel", NAME, "-n", namespace, "--timeout=60s")
        wait_for(lambda: get(kube, "deployment", CANARY, namespace) is None, 120, "the canary Deployment collected")
    finally:
        load.stop()
        api.close()
        kubelet.stop()


def test_the_operator_canaries_a_restart_change_on_an_extra_pod(kube, namespace, prometheus, model_cache,
                                                                 tmp_path) -> None:
    """The whole operator (its own process), hotReconfigure off, one replica and room for one more: its first change
    runs on an extra pod while the main pod keeps serving the old config, the status names the extra pod and never
    counts it as a replica, the verdict says Canary, and the canary Deployment is gone afterwards."""
    server = prometheus(scrape_interval_s=0.5)
    kubelet = KubeletStandIn(kube.api_client(), namespace, NAME, server, tmp_path).start()
    operator = OperatorProcess(kube.kubeconfig, tmp_path / "operator", {
        "SLOTUNE_PROMETHEUS_URL": server.url, "SLOTUNE_POD_ENDPOINTS_FILE": str(kubelet.endpoints_file)})
    load = Load(kubelet.urls, WorkloadSpec.model_validate(WORKLOAD), Shape(clients=WORKLOAD["concurrency"]))
    manifest = tunedmodel(namespace)
    manifest["spec"]["tuning"] = {"knobs": ["max_num_seqs"], "hotReconfigure": False,
                                  "bounds": {"maxNumSeqs": {"min": 1, "max": 64}, "minReplicas": 1, "maxReplicas": 2},
                                  "windowSeconds": 6, "minSamples": 10, "warmupSeconds": 1, "cooldownSeconds": 0,
                                  "maxIterations": 3, "convergenceWindows": 2}
    manifest["spec"]["slo"] = {"ttft": {"p99": TTFT_P99_MS}}  # missed at one sequence a pod on any CPU

    def status() -> dict[str, Any]:
        return (get(kube, "tunedmodel", NAME, namespace) or {}).get("status") or {}

    def live() -> dict[str, int]:
        return live_seqs(kubelet)

    def describe() -> str:
        return f"status: {status()}\npods: {live()}; kubelet errors: {kubelet.errors}\n{operator.log_tail()}"

    try:
        operator.start()
        apply(kube, manifest)
        wait_for(lambda: len(kubelet.urls()) == 1, 180, "the main pod serving", describe=describe)
        (main,) = live() or [""]
        load.start()
        during = wait_for(lambda: (s := status()).get("canary") and s["canary"]["pod"] in live() and s, 300,
                          "a canary on an extra pod, serving", describe=describe)
        canary_pod, candidate = during["canary"]["pod"], during["canary"]["config"]["maxNumSeqs"]
        assert canary_pod != main and get(kube, "deployment", CANARY, namespace) is not None
        pods = live()
        assert pods[canary_pod] == candidate and pods[main] == during["config"]["maxNumSeqs"] == 1, pods
        ready = next(c for c in during["conditions"] if c["type"] == "Ready")
        assert ready["message"].startswith("1/1 pods ready"), ready  # the extra pod is not a serving replica
        wait_for(lambda: any(h.get("verification") == "Canary" for h in status().get("history", [])), 300,
                 "a canary verdict", describe=describe)
        final = status()
        verdict = next(h for h in final["history"] if h.get("verification") == "Canary")
        assert verdict["verdict"] in ("Kept", "RolledBack") and "canary verification" in verdict["reason"], verdict
        wait_for(lambda: get(kube, "deployment", CANARY, namespace) is None or status().get("canary"), 120,
                 "the canary Deployment deleted after its verdict", describe=describe)
    finally:
        load.stop()
        operator.stop()
        kubelet.stop()
