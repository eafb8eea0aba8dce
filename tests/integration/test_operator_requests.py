"""What one TunedModel's create costs the API server in slotune's own requests, counted by the operator itself
(slotune_operator_api_requests_total by method and resource) against a real API server, a real Prometheus and the
operator process: from the create until every TunedModel's Deployment is ready and its status says so.

At 1,000 TunedModels the burst of creates is bound by the API server (each create cost 35.4 requests from all clients,
11.1 of them slotune's), so a request added per create is a thousand more the next TunedModels wait behind. The
budget below is what a create needs (see BUDGET); a change that adds one fails here, not in a 40-minute benchmark.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.harness.kube import install_tunedmodel_crd, items, scratch_namespace, wait_for_progress
from tests.e2e.harness.operator import OperatorProcess
from tests.harness.fleet import FleetExporter, fleet_tunedmodel
from tests.harness.ports import free_port

NUM_TUNEDMODELS = 10
STALL_S = 120
# Per create, by "METHOD resource": what a create needs. Its children (one apply or create each, the NetworkPolicy among
# them), its status (the first save, and Ready once the pods are), its events (Deployed, and each phase it reaches:
# slotune's own, with reasons; kopf posts none below Warning), the pods looked at while the rollout runs (one list a
# look, the looks backing off 2, 4, 8 ... s, so their number follows how long the rollout takes on a busy machine), the
# discovery of the ServiceMonitor API (once a minute) and the ServiceMonitor where that API is served. Nothing else: the
# store reads the status kopf's watch holds, and the Deployment and Secret come from the operator's own watches. A
# create handler that failed on a busy API server (a timeout) and was retried applies its children again: half a write
# per child is left for that; a second write of every child is not.
BUDGET = {"PATCH deployments": 1.5, "PATCH services": 1.5, "PATCH networkpolicies": 1.5, "POST secrets": 1.5,
          "PATCH tunedmodels/status": 2.0, "POST events": 3.0, "GET pods": 4.0, "GET monitoring.coreos.com/v1": 1.0,
          "PATCH servicemonitors": 1.5}  # where the ServiceMonitor CRD is installed (another test of the session)


@pytest.fixture
def namespace(kube) -> Iterator[str]:
    install_tunedmodel_crd(kube)
    with scratch_namespace(kube, "requests") as name:
        yield name


def slotune_requests(url: str) -> Counter[str]:
    """The operator's own count of its requests, as "METHOD resource"."""
    found: Counter[str] = Counter()
    for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        for sample in family.samples:
            if sample.name == "slotune_operator_api_requests_total":
                found[f"{sample.labels['method']} {sample.labels['resource']}"] += int(sample.value)
    return found


def test_a_create_costs_slotune_few_requests(kube, namespace, prometheus, tmp_path) -> None:
    names = [f"tm{i:02d}" for i in range(NUM_TUNEDMODELS)]
    fleet = FleetExporter(requests_per_s=1.0).start()
    targets = [fleet.add(namespace, f"{name}-runtime", "fleet") for name in names]
    prom = prometheus(targets=[(t.address, t.labels) for t in targets], scrape_interval_s=1.0)
    port = free_port()
    operator = OperatorProcess(kube.kubeconfig, tmp_path / "operator", {
        "SLOTUNE_PROMETHEUS_URL": prom.url, "SLOTUNE_METRICS_PORT": str(port), "SLOTUNE_WATCH_NAMESPACES": namespace,
        "SLOTUNE_TICK_S": "2"})
    url = f"http://127.0.0.1:{port}/metrics"

    def settled() -> int:  # a Deployment ready, and a status that says so
        return sum(1 for tm in items(kube, "tunedmodels", namespace)
                   if any(c["type"] == "Ready" and c["status"] == "True"
                          for c in (tm.get("status") or {}).get("conditions") or []))

    try:
        with operator:
            before = slotune_requests(url)
            manifest = {"apiVersion": "v1", "kind": "List",
                        "items": [fleet_tunedmodel(n, namespace, 300) for n in names]}  # no window ends meanwhile
            kube.kubectl("apply", "-f", "-", input=json.dumps(manifest))
            wait_for_progress(settled, len(names), STALL_S, "TunedModels ready", describe=operator.log_tail)
            sent = slotune_requests(url) - before
    finally:
        fleet.stop()
    per_create = {kind: count / len(names) for kind, count in sorted(sent.items()) if count}
    events = json.loads(kube.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)["items"]
    posted = Counter(e["reason"] for e in events if (e.get("source") or {}).get("component") == "slotune-operator")
    said = f"slotune's requests per create: {per_create}; its events: {dict(posted)}"
    print(said)
    assert set(per_create) <= set(BUDGET), said  # a kind of request a create never needed
    assert all(per_create[kind] <= BUDGET[kind] for kind in per_create), said
    assert per_create.get("PATCH deployments", 0) >= 1.0 and per_create.get("POST secrets", 0) >= 1.0, said
    assert "GET tunedmodels" not in per_create, said  # the store starts from the watched status
