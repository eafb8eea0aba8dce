"""One operator replica, many TunedModels: all get their children and a measured window, none waits for another.

With a synchronous daemon per TunedModel, kopf's thread pool (min(32, cores + 4) threads: 6 on a 2-core machine)
filled with daemons sleeping through their windows, and create handlers queued behind them forever: 6 of 40
TunedModels got a Deployment. Here 40 (over 3x that pool) must all be deployed and all measure a window. kwok runs
no containers, so tests/harness/fleet.py serves the deployments' metrics to a real Prometheus; everything else (the
operator process, the control plane, Prometheus, PromQL) is real.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest

from tests.e2e.harness.kube import install_tunedmodel_crd, items, scratch_namespace, wait_for_progress
from tests.e2e.harness.operator import OperatorProcess
from tests.harness.fleet import FleetExporter, fleet_tunedmodel

NUM_TUNEDMODELS = max(40, 3 * min(32, (os.cpu_count() or 1) + 4))  # 3x kopf's default thread pool, at least
STALL_S = 120  # no TunedModel made progress for this long: the operator is stuck, not slow
DELETED = 5
SIGTERM_S = 10.0  # issue 15: the operator stops within 10 s of SIGTERM at any scale
# DELETED deletes at once, kubectl's own start included: a daemon that held its finalizer until kopf's cancellation
# timeout (15 s, the "every delete takes ~15 s") fails it; one run under a 1,000-create burst on the same 2
# cores took 8 s (issue 15's bar, 2 s each at 1,000, is the scale bench's).
DELETE_S = 12.0


@pytest.fixture
def namespace(kube) -> Iterator[str]:
    install_tunedmodel_crd(kube)
    with scratch_namespace(kube, "scale") as name:
        yield name


def test_three_thread_pools_of_tunedmodels_all_deploy_and_measure(kube, operator_kubeconfig, namespace, prometheus,
                                                                  tmp_path) -> None:
    names = [f"tm{i:03d}" for i in range(NUM_TUNEDMODELS)]
    fleet = FleetExporter(requests_per_s=4.0).start()
    targets = [fleet.add(namespace, f"{name}-runtime", "fleet") for name in names]
    prom = prometheus(targets=[(t.address, t.labels) for t in targets], scrape_interval_s=1.0)
    operator = OperatorProcess(operator_kubeconfig, tmp_path / "operator", {"SLOTUNE_PROMETHEUS_URL": prom.url})

    def deployed() -> int:
        return sum(1 for d in items(kube, "deployments", namespace) if d["metadata"]["name"].endswith("-runtime"))

    def measured() -> int:
        return sum(1 for tm in items(kube, "tunedmodels", namespace)
                   if ((tm.get("status") or {}).get("iteration") or 0) >= 1 and tm["status"].get("observed"))

    def describe() -> str:
        return f"deployed {deployed()}, measured {measured()}\n{operator.log_tail()}"

    try:
        with operator:
            manifest = {"apiVersion": "v1", "kind": "List", "items": [fleet_tunedmodel(n, namespace, 5) for n in names]}
            kube.kubectl("apply", "-f", "-", input=json.dumps(manifest))
            wait_for_progress(deployed, len(names), STALL_S, "Deployments created", describe=describe)
            wait_for_progress(measured, len(names), STALL_S, "TunedModels with a measured window",
                              describe=describe)
            assert operator.alive()
            # Deleting some while all the others keep ticking: their daemons stop and their finalizers go.
            started = time.monotonic()
            kube.kubectl("delete", "tunedmodel", *names[:DELETED], "-n", namespace, "--timeout=60s")
            delete_s = time.monotonic() - started
            # SIGTERM with every daemon alive and reads in flight: the operator exits by itself, within the bar.
            started = time.monotonic()
            operator.stop()
            sigterm_s = time.monotonic() - started
        assert operator.process is not None and operator.process.returncode != -9, operator.log_tail()
        log = operator.log_tail(5000)
    finally:
        fleet.stop()
    print(f"{DELETED} deletes took {delete_s:.2f} s (kubectl included); SIGTERM to exit {sigterm_s:.2f} s")
    assert sigterm_s < SIGTERM_S, log[-3000:]  # issue 15's bar at any scale (at 500-1,000 a read in flight held it)
    assert delete_s < DELETE_S, log[-3000:]
    assert "tick failed" not in log, log
    assert "Activity 'close' succeeded" in log and "stopped: the event loop ended" in log, log[-3000:]
    # Every one was measured (above); its latest window may since have come up short: on a busy machine a scrape of
    # the fleet can land late enough that a 5 s window holds under 10 requests. Any other reason is a fault.
    for tm in items(kube, "tunedmodels", namespace):
        metrics = next(c for c in tm["status"]["conditions"] if c["type"] == "MetricsAvailable")
        assert metrics["status"] == "True" or metrics["reason"] == "TooFewSamples", (metrics, tm["status"]["message"])
