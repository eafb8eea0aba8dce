"""End to end on the real control plane: a TunedModel that starts from a poor configuration converges to its SLO.

Everything is real but where the runtime runs: the operator (`slotune operator` subprocess), the control plane with
kwok GPU nodes, Prometheus, the runtime processes (`python -m gpu_runtime serve`, tiny model, CPU) and the load
(slotune.loadgen). kwok runs no containers, so tests/e2e/harness/kubelet.py stands in for the kubelet: it starts a
runtime process per Ready pod with the pod's own arguments and registers it with Prometheus under the pod's labels.
The operator is killed (SIGKILL) while a change awaits verification and restarted; it must resume from the status.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slotune.workload import WorkloadSpec
from tests.e2e.harness.kube import apply, condition, events, get, install_tunedmodel_crd, scratch_namespace, wait_for
from tests.e2e.harness.kubelet import KubeletStandIn
from tests.e2e.harness.load import Load, Shape
from tests.e2e.harness.operator import OperatorProcess

ROOT = Path(__file__).resolve().parents[2]
TTFT_P99_TARGET_MS = 1000.0
# Closed loop, so one sequence at a time misses the target on any machine: each request first waits for the 23
# others to decode ~128 tokens, ~2,900 steps (3.8 s at the 1.3 ms steps seen here, more on busier cores), against a
# step or two once they share a batch. Open-loop rates miss only on cores slow enough for them: 5/s met the target
# at maxNumSeqs 1 when the test's own generator fell behind under CPU hogs, 4/s on quiet cores in local mode.
WORKLOAD = {"profile": "custom", "arrival": "concurrency", "concurrency": 24,
            "promptTokens": {"p50": 32, "p99": 64}, "outputTokens": {"p50": 128, "p99": 160}}


def tunedmodel(name: str, namespace: str) -> dict[str, Any]:
    """One replica of the tiny model that runs one sequence at a time: requests queue and TTFT misses its target."""
    return {
        "apiVersion": "slotune.io/v1alpha1", "kind": "TunedModel",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "tiny", "source": "builtin://tiny", "dtype": "float32", "maxModelLen": 512},
            "hardware": {"accelerator": "cpu", "count": 0},
            "runtime": {"engine": "builtin", "config": {"maxNumSeqs": 1, "maxNumBatchedTokens": 256}},
            "slo": {"ttft": {"p99": TTFT_P99_TARGET_MS}},
            "workload": WORKLOAD,
            "replicas": 1,
            "tuning": {"knobs": ["max_num_seqs", "max_num_batched_tokens"],
                       "bounds": {"maxNumSeqs": {"min": 1, "max": 64}, "maxNumBatchedTokens": {"min": 64, "max": 2048}},
                       "windowSeconds": 6, "minSamples": 10, "warmupSeconds": 1, "cooldownSeconds": 0,
                       "maxIterations": 6, "convergenceWindows": 2},
        },
    }


@pytest.fixture
def namespace(kube) -> Iterator[str]:
    install_tunedmodel_crd(kube)
    with scratch_namespace(kube, "e2e") as name:
        yield name


def status_of(kube, namespace: str) -> dict[str, Any]:
    return (get(kube, "tunedmodel", "slow", namespace) or {}).get("status") or {}


def test_poor_config_converges_to_its_slo_across_an_operator_restart(kube, operator_kubeconfig, namespace, prometheus,
                                                                     model_cache, tmp_path) -> None:
    prom = prometheus(scrape_interval_s=0.5)
    kubelet = KubeletStandIn(kube.api_client(), namespace, "slow", prom, tmp_path).start()
    operator = OperatorProcess(operator_kubeconfig, tmp_path / "operator", {
        "SLOTUNE_PROMETHEUS_URL": prom.url, "SLOTUNE_POD_ENDPOINTS_FILE": str(kubelet.endpoints_file)})
    load = Load(kubelet.urls, WorkloadSpec.model_validate(WORKLOAD), Shape(clients=WORKLOAD["concurrency"]))

    def describe() -> str:
        return f"status: {status_of(kube, namespace)}\nkubelet errors: {kubelet.errors}\n{operator.log_tail()}"

    try:
        operator.start()
        apply(kube, tunedmodel("slow", namespace))
        wait_for(kubelet.urls, 120, "a runtime process for the pod", describe=describe)
        load.start()
        # Kill the operator while its first change awaits verification, then start a new one.
        wait_for(lambda: status_of(kube, namespace).get("phase") == "Verifying", 180, "a change under verification",
                 describe=describe)
        before_kill = status_of(kube, namespace)
        operator.kill()
        operator.start()
        wait_for(lambda: status_of(kube, namespace).get("phase") in ("Converged", "Infeasible"), 300, "Converged",
                 describe=describe)
        operator.stop()  # nothing changes after this: the status and the pods can be compared
        final = status_of(kube, namespace)
        live = {pod: {k: config[k] for k in ('max_num_seqs', 'max_num_batched_tokens')}
                for pod, config in kubelet.live_configs().items()}
    finally:
        load.stop()
        operator.stop()
        kubelet.stop()
    print(operator.log_tail())

    assert final["phase"] == "Converged", describe()
    running = {"max_num_seqs": final["config"]["maxNumSeqs"],
               "max_num_batched_tokens": final["config"]["maxNumBatchedTokens"]}
    assert live and all(config == running for config in live.values()), (live, running)  # read back from the pods
    assert final["sloMet"] is True
    assert final["observed"]["ttft"]["p99"] <= TTFT_P99_TARGET_MS
    assert final["iteration"] > before_kill["iteration"]  # resumed from the status, not started over
    history = final["history"]
    kept = [h for h in history if h["verdict"] == "Kept"]
    assert kept, history
    for entry in history:  # every step shows what it changed and the numbers before and after
        assert entry["change"] and entry["before"]["ttft"]["p99"] is not None
        if entry["verdict"] in ("Kept", "RolledBack"):
            assert entry["after"]["ttft"]["p99"] is not None
    first = kept[0]
    assert first["after"]["ttft"]["p99"] < first["before"]["ttft"]["p99"]
    assert final["config"]["maxNumSeqs"] > 1
    assert condition({"status": final}, "SLOMet")["status"] == "True"
    assert condition({"status": final}, "MetricsAvailable")["status"] == "True"
    printed = kube.kubectl("get", "tunedmodel", "slow", "-n", namespace).stdout.splitlines()
    assert printed[0].split()[:4] == ["NAME", "PHASE", "SLO", "MET"] and "Converged" in printed[1]
    assert "true" in printed[1].split()  # printer columns read the status
    reasons = [e["reason"] for e in events(kube, namespace, "slow")]
    assert "ChangeDecided" in reasons and "ChangeKept" in reasons and "Reconfigured" in reasons
    assert kubelet.started_total == 1  # batching knobs changed live: the pod was never restarted
