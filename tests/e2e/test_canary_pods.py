"""Canary verification on real runtime pods: the candidate goes to one ready pod by `/admin/config`, closed-loop load
is split evenly over the pods, per-pod PromQL over the same window judges canary against sibling, and the canary is
promoted to every pod or rolled back on the canary pod alone. Every pod's live config (`GET /admin/config`) is read
back after each step, and the sibling never changes during a canary.

The test plays the loop's part (start the canary, judge its window, end it and apply the verdict), as
test_pod_config_invariant does; the operator's Kubernetes backend, per-pod reads (slotune.metrics.per_pod) and
decision rule (slotune.judge.canary) are the real ones, as are the control plane, Prometheus and the runtime processes
(tests/e2e/harness/kubelet.py runs one per Ready pod of kwok's fake nodes). tests/unit/test_loop_canary.py covers
the tuner's side of the same path.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from slotune.api import parse_tunedmodel
from slotune.backends.kube_api import KubeAPI
from slotune.backends.kube_canary import CanaryAssignment
from slotune.backends.kube_deployment import KubernetesBackend
from slotune.controller.run import deploy
from slotune.judge.canary import CanaryOutcome, CanaryVerdict, judge
from slotune.knobs import RuntimeConfig
from slotune.metrics.names import names_for
from slotune.metrics.per_pod import ArmWindows, arm_windows
from slotune.metrics.promql import Selector
from slotune.metrics.window import MetricsUnavailable
from slotune.settings import OperatorSettings
from slotune.snapshot import LatencyMetric
from slotune.workload import WorkloadSpec
from tests.e2e.harness.kube import apply, get, install_tunedmodel_crd, scratch_namespace, wait_for, wait_for_progress
from tests.e2e.harness.kubelet import KubeletStandIn
from tests.e2e.harness.load import Load, Shape
from tests.e2e.harness.operator import OperatorProcess
from tests.e2e.harness.pods import seqs, settle

NAME = "canary"
# Closed loop, 8 requests in flight per pod: at one sequence at a time each request waits for the others' decodes,
# at 16 they share a batch. Which way TTFT moves is then never in doubt; the test asserts the verdict follows it.
WORKLOAD = {"profile": "custom", "arrival": "concurrency", "concurrency": 16,
            "promptTokens": {"p50": 32, "p99": 64}, "outputTokens": {"p50": 48, "p99": 64}}
TTFT_P99_MS = 100
ARM_REQUESTS = 60  # requests each arm must finish in the canary window before it is judged


def tunedmodel(namespace: str, name: str = NAME, replicas: int = 2,
               tuning: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "slotune.io/v1alpha1", "kind": "TunedModel",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "tiny", "source": "builtin://tiny", "dtype": "float32", "maxModelLen": 256},
            "hardware": {"accelerator": "cpu", "count": 0},
            "runtime": {"engine": "builtin", "config": {"maxNumSeqs": 1, "maxNumBatchedTokens": 256}},
            "slo": {"ttft": {"p99": 1000}},
            "replicas": replicas,
            "tuning": tuning or {"mode": "off", "windowSeconds": 5, "minSamples": 10},
        },
    }


@pytest.fixture
def namespace(kube) -> Iterator[str]:
    install_tunedmodel_crd(kube)
    with scratch_namespace(kube, "canary") as name:
        yield name


def test_canary_promoted_when_better_rolled_back_alone_when_worse(kube, namespace, prometheus, model_cache,
                                                                   tmp_path) -> None:
    server = prometheus()
    kubelet = KubeletStandIn(kube.api_client(), namespace, NAME, server, tmp_path).start()
    settings = OperatorSettings(pod_endpoints_file=kubelet.endpoints_file, rollout_timeout_s=300)
    api = KubeAPI.from_environment(str(kube.kubeconfig))
    selector = Selector(namespace=namespace, deployment=f"{NAME}-runtime", model="tiny")
    load = Load(kubelet.urls, WorkloadSpec.model_validate(WORKLOAD), Shape(clients=WORKLOAD["concurrency"]))

    def canary_window(pod: str) -> ArmWindows:
        """Both arms over the same window, from when the canary was confirmed running until each arm finished
        ARM_REQUESTS requests (waiting on their progress, never on a clock)."""
        start_s = time.time()
        found: list[ArmWindows] = []

        def least() -> int:
            try:
                found[:] = [arm_windows(server.url, names_for("builtin"), selector, pod, time.time() - start_s,
                                        time.time())]
            except MetricsUnavailable:
                return 0
            return min(found[0].canary.num_requests, found[0].baseline.num_requests)

        wait_for_progress(least, ARM_REQUESTS, 180, "requests in both arms of the canary window",
                          describe=lambda: f"{kubelet.errors}")
        return found[0]

    def run_canary(backend: KubernetesBackend, running: RuntimeConfig, candidate: RuntimeConfig) -> CanaryVerdict:
        started = settle(lambda: backend.start_canary(running, candidate).result)
        assert started.ok, started.reason
        assignment = CanaryAssignment.of(backend.deployment())
        assert assignment is not None and assignment.config == candidate
        (sibling,) = [pod for pod in kubelet.pods if pod != assignment.pod]
        live = seqs(kubelet)
        assert live == {assignment.pod: candidate.max_num_seqs, sibling: running.max_num_seqs}
        arms = canary_window(assignment.pod)
        assert arms.baseline_pods == (sibling,)
        assert seqs(kubelet)[sibling] == running.max_num_seqs  # the sibling never changed during the canary
        return judge(arms.baseline, arms.canary, LatencyMetric.TTFT, 99, parse_tunedmodel(
            get(kube, "tunedmodel", NAME, namespace)).spec.slo)

    try:
        apply(kube, tunedmodel(namespace))
        tm = parse_tunedmodel(get(kube, "tunedmodel", NAME, namespace))
        deploy(api, tm, settings, restart_tuning=True)
        backend = KubernetesBackend(api, tm, settings)
        slow = tm.spec.initial_config()
        assert settle(lambda: backend.apply(slow)).ok
        wait_for(lambda: len(seqs(kubelet)) == 2, 180, "both pods serving", describe=lambda: f"{kubelet.errors}")
        assert seqs(kubelet) == dict.fromkeys(kubelet.pods, 1)
        started = kubelet.started_total
        load.start()

        # A better candidate: promoted, then every pod runs it.
        fast = slow.with_changes(max_num_seqs=16)
        verdict = run_canary(backend, slow, fast)
        assert verdict.outcome is CanaryOutcome.PROMOTE, verdict.reason
        backend.end_canary()
        assert settle(lambda: backend.apply(fast)).ok
        assert seqs(kubelet) == dict.fromkeys(kubelet.pods, 16)

        # A worse candidate: rolled back on the canary pod alone, the sibling keeps serving what it ran.
        verdict = run_canary(backend, fast, slow)
        assert verdict.outcome is CanaryOutcome.WORSE, verdict.reason
        backend.end_canary()
        assert CanaryAssignment.of(backend.deployment()) is None
        assert settle(lambda: backend.apply(fast)).ok
        assert seqs(kubelet) == dict.fromkeys(kubelet.pods, 16)
        assert kubelet.started_total == started  # every change was live: no pod restarted
    finally:
        load.stop()
        api.close()
        kubelet.stop()


def test_the_operator_verifies_a_live_change_as_a_canary(kube, namespace, prometheus, model_cache, tmp_path) -> None:
    """The whole operator (its own process): with two replicas, its first change goes to one pod; while it is
    verified the status names that pod and its config and the pods run exactly that split; the verdict says Canary,
    and afterwards every pod runs the config the status calls running."""
    server = prometheus(scrape_interval_s=0.5)
    kubelet = KubeletStandIn(kube.api_client(), namespace, NAME, server, tmp_path).start()
    operator = OperatorProcess(kube.kubeconfig, tmp_path / "operator", {
        "SLOTUNE_PROMETHEUS_URL": server.url, "SLOTUNE_POD_ENDPOINTS_FILE": str(kubelet.endpoints_file)})
    load = Load(kubelet.urls, WorkloadSpec.model_validate(WORKLOAD), Shape(clients=WORKLOAD["concurrency"]))
    manifest = tunedmodel(namespace)
    manifest["spec"]["tuning"] = {"knobs": ["max_num_seqs"], "bounds": {"maxNumSeqs": {"min": 1, "max": 64}},
                                  "windowSeconds": 6, "minSamples": 10, "warmupSeconds": 1, "cooldownSeconds": 0,
                                  "maxIterations": 4, "convergenceWindows": 2}
    # The start must miss on any CPU, so the first change is one that wants capacity (a canary), not a cost-saving
    # trim (before/after): at one sequence per pod a request waits for ~7 others' 48-token decodes, ~340 steps,
    # 170 ms at a fast CPU's 0.5 ms steps; at 16 it waits a step or two. At 1,000 ms a start met its target once.
    manifest["spec"]["slo"] = {"ttft": {"p99": TTFT_P99_MS}}

    def status() -> dict[str, Any]:
        return (get(kube, "tunedmodel", NAME, namespace) or {}).get("status") or {}

    def describe() -> str:
        return f"status: {status()}\nkubelet errors: {kubelet.errors}\n{operator.log_tail()}"

    try:
        operator.start()
        apply(kube, manifest)
        wait_for(lambda: len(kubelet.urls()) == 2, 180, "both pods serving", describe=describe)
        load.start()
        wait_for(lambda: status().get("canary"), 300, "a canary under verification", describe=describe)
        during = status()
        canary_pod, candidate = during["canary"]["pod"], during["canary"]["config"]["maxNumSeqs"]
        live = seqs(kubelet)
        assert live[canary_pod] == candidate, (live, during["canary"])
        assert all(n == during["config"]["maxNumSeqs"] for pod, n in live.items() if pod != canary_pod), live
        wait_for(lambda: any(h.get("verification") == "Canary" for h in status().get("history", [])), 300,
                 "a canary verdict", describe=describe)
        # Every pod then runs what the status says. Checked while the operator runs, at a moment when nothing is in
        # flight (no canary, nothing being verified or rolled out): the loop goes on tuning, and a pod its stand-in
        # relaunched from the template is brought back in line at the next window's end, not at once.
        wait_for(lambda: settled(status(), seqs(kubelet)), 300, "every pod running the config the status names",
                 describe=lambda: f"pods: {seqs(kubelet)}; restarts: {kubelet.started_total - 2}\n{describe()}")
        final = status()
    finally:
        load.stop()
        operator.stop()
        kubelet.stop()
    verdict = next(h for h in final["history"] if h.get("verification") == "Canary")
    assert verdict["verdict"] in ("Kept", "RolledBack") and "canary verification" in verdict["reason"], verdict


def settled(status: dict[str, Any], live: dict[str, int]) -> bool:
    """No canary, nothing verified or rolling out, and every pod running the status' config."""
    return (not status.get("canary") and status.get("phase") != "Verifying"
            and loop_state(status).get("rollout") is None and bool(live)
            and live == dict.fromkeys(live, (status.get("config") or {}).get("maxNumSeqs")))


def loop_state(status: dict[str, Any]) -> dict[str, Any]:
    """The loop's state as the operator saved it in the status (what it applied, what is still rolling out)."""
    saved = ((status.get("kopf") or {}).get("slotuneState") or {}).get("state")
    return json.loads(saved) if saved else {}
