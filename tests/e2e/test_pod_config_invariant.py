"""The invariant the status relies on, on real runtime pods: after every transition the loop makes (apply, keep, roll
back, keep, new spec generation, right-sizing, pod restart, operator restart) every ready pod answers
`GET /admin/config` with exactly the config the loop calls running.

The test plays the loop's part (it tells the operator's Kubernetes backend which config is running, as the Tuner
does) and reads each pod back itself. The backend, the control plane, the Deployment controller and the runtime
processes are real; tests/e2e/harness/kubelet.py runs a `python -m gpu_runtime serve` process for each Ready pod of
kwok's fake nodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from slotune.api import parse_tunedmodel
from slotune.backends.kube_api import KubeAPI
from slotune.backends.kube_deployment import KubernetesBackend
from slotune.controller.run import deploy
from slotune.knobs import RuntimeConfig
from slotune.settings import OperatorSettings
from tests.e2e.harness.kube import apply, get, install_tunedmodel_crd, scratch_namespace, wait_for
from tests.e2e.harness.kubelet import KubeletStandIn
from tests.e2e.harness.pods import seqs, settle

NAME = "inv"


def tunedmodel(namespace: str, max_num_seqs: int) -> dict[str, Any]:
    return {
        "apiVersion": "slotune.io/v1alpha1", "kind": "TunedModel",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "model": {"name": "tiny", "source": "builtin://tiny", "dtype": "float32", "maxModelLen": 256},
            "hardware": {"accelerator": "cpu", "count": 0},
            "runtime": {"engine": "builtin", "config": {"maxNumSeqs": max_num_seqs, "maxNumBatchedTokens": 256}},
            "slo": {"ttft": {"p99": 1000}},
            "replicas": 2,
            "tuning": {"mode": "off", "windowSeconds": 5, "minSamples": 10},
        },
    }


@pytest.fixture
def namespace(kube) -> Iterator[str]:
    install_tunedmodel_crd(kube)
    with scratch_namespace(kube, "inv") as name:
        yield name


def test_every_ready_pod_runs_what_the_loop_calls_running(kube, operator_kubeconfig, namespace, prometheus, model_cache,
                                                           tmp_path) -> None:
    kubelet = KubeletStandIn(kube.api_client(), namespace, NAME, prometheus(), tmp_path).start()
    settings = OperatorSettings(pod_endpoints_file=kubelet.endpoints_file, rollout_timeout_s=300)
    api = KubeAPI.from_environment(str(operator_kubeconfig))

    def parsed() -> Any:
        return parse_tunedmodel(get(kube, "tunedmodel", NAME, namespace))

    def check(backend: KubernetesBackend, config: RuntimeConfig, step: str) -> None:
        result = settle(lambda: backend.apply(config))
        assert result.ok, f"{step}: {result.reason}\nkubelet errors: {kubelet.errors}"
        wait_for(lambda: len(seqs(kubelet)) == config.replicas, 120, f"{step}: every pod serving",
                 describe=lambda: f"{kubelet.errors}")
        assert seqs(kubelet) == dict.fromkeys(kubelet.pods, config.max_num_seqs), step

    try:
        apply(kube, tunedmodel(namespace, max_num_seqs=16))
        tm = parsed()
        deploy(api, tm, settings, restart_tuning=True)  # what the create handler does
        backend = KubernetesBackend(api, tm, settings)
        initial = tm.spec.initial_config()
        check(backend, initial, "first deploy")
        check(backend, initial.with_changes(max_num_seqs=32), "a change, kept")
        check(backend, initial, "a rollback to a config sent before")
        check(backend, initial.with_changes(max_num_seqs=64), "another change, kept")

        # A new spec generation whose starting config is the one the Deployment's template was rendered from:
        # the template does not change, so no pod restarts, yet the pods run 64 until they are told otherwise.
        apply(kube, _with_bounds(tunedmodel(namespace, max_num_seqs=16)))
        tm = parsed()
        assert tm.metadata.generation == 2
        deploy(api, tm, settings, restart_tuning=True)  # what the update handler does
        started = kubelet.started_total
        backend = KubernetesBackend(api, tm, settings)  # a new generation is a new run
        check(backend, tm.spec.initial_config(), "a new generation on the template's own config")
        assert kubelet.started_total == started  # reconfigured live, not restarted

        live = tm.spec.initial_config().with_changes(max_num_seqs=48)
        check(backend, live, "a live change")
        check(backend, live.with_changes(replicas=3), "right-sizing up: the new pod starts from the template")
        check(backend, live, "right-sizing down")
        victim = sorted(kubelet.pods)[0]
        kube.kubectl("delete", "pod", victim, "-n", namespace, "--wait=false")  # comes back with the template's 16
        wait_for(lambda: victim not in kubelet.pods and len(kubelet.urls()) == 2, 120, "the replacement pod serving",
                 describe=lambda: f"{kubelet.errors}")
        backend = KubernetesBackend(api, tm, settings)  # an operator restart: nothing remembered
        check(backend, live, "an operator restart after a pod restart")
    finally:
        api.close()
        kubelet.stop()


def _with_bounds(manifest: dict[str, Any]) -> dict[str, Any]:
    """The same starting config under a changed spec (a new generation): a wider batch bound."""
    manifest["spec"]["tuning"]["bounds"] = {"maxNumSeqs": {"min": 1, "max": 128}}
    return manifest
