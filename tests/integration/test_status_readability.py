"""What a person reads with `kubectl get tm` and `kubectl describe tm`, for a fresh, a measured, a converged and a
degraded TunedModel, on the real API server with the CRD's printer columns.

The fresh and the degraded ones are the operator's work (a real `slotune operator`; the degraded one asks for a PVC
that does not exist, so its pod stays unschedulable). A measured and a converged status need real windows from
Prometheus; here they are written through the status subresource exactly as the operator writes them
(`status_body` of a loop state, with a verdict from slotune.judge.verification), so what is checked is what kubectl
shows. The operator's peering check is here too: its warning is the first thing a person reads in its log.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slotune.api import Phase, Verdict
from slotune.api.status import Observed, Percentiles
from slotune.controller.status import Health, status_body
from slotune.judge.verification import compare
from slotune.knobs import RuntimeConfig
from slotune.loop.state import HistoryRecord, TuningState
from slotune.snapshot import Histogram, LatencySummary
from tests.e2e.harness.kube import apply, condition, events, get, install_tunedmodel_crd, scratch_namespace, wait_for
from tests.e2e.harness.operator import OperatorProcess
from tests.integration.test_operator import tunedmodel

ROOT = Path(__file__).resolve().parents[2]
NO_PROMETHEUS_YET = "http://127.0.0.1:9"  # configured, never asked: every window here outlasts the test
LONG_WINDOW = {"mode": "off", "windowSeconds": 3600, "minSamples": 10}


@pytest.fixture
def namespace(kube) -> Iterator[str]:
    install_tunedmodel_crd(kube)
    with scratch_namespace(kube, "read") as name:
        yield name


def observed(ttft_p99_ms: float, tpot_p99_ms: float, requests: int) -> Observed:
    return Observed(window_s=60.000000001, num_requests=requests, ttft=Percentiles(p50_ms=ttft_p99_ms / 3,
                    p99_ms=ttft_p99_ms), tpot=Percentiles(p99_ms=tpot_p99_ms), generation_tokens_per_s=1234.56789,
                    prefix_cache_hit_rate=0.123456)


def kept_change() -> HistoryRecord:
    upper = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, float("inf"))

    def summary(counts: tuple[float, ...]) -> LatencySummary:
        histogram = Histogram(upper_s=upper, counts=counts)
        return LatencySummary(p99_ms=histogram.quantile_s(0.99) * 1000, histogram=histogram)

    change = compare(summary((0, 0, 0, 0, 0, 0, 0, 100, 100, 0)), summary((150, 50, 0, 0, 0, 0, 0, 0, 0, 0)), 99,
                     "ttft_p99")
    return HistoryRecord(iteration=2, time=datetime.now(UTC), knob="max_num_seqs", change="max_num_seqs 1 -> 64",
                         reason="queue time dominates TTFT", before=observed(9900.0, 10.7, 300),
                         after=observed(49.000000000001, 18.9, 900), config=RuntimeConfig(max_num_seqs=64),
                         verdict=Verdict.KEPT, detail=f"SLO now met; {change.describe()}")


def write_status(kube, name: str, namespace: str, state: TuningState) -> None:
    body = status_body(state, Health(ready=True, ready_message="2/2 pods ready"), [], 1)
    kube.kubectl("patch", "tunedmodel", name, "-n", namespace, "--subresource=status", "--type=merge", "-p",
                 json.dumps({"status": body}))


def describe(kube, name: str, namespace: str) -> str:
    return kube.kubectl("describe", "tunedmodel", name, "-n", namespace).stdout


def row(kube, name: str, namespace: str) -> str:
    lines = kube.kubectl("get", "tm", name, "-n", namespace).stdout.splitlines()
    assert lines[0].split()[:6] == ["NAME", "PHASE", "SLO", "MET", "TTFT", "P99"], lines[0]
    return lines[1]


def agree(found: dict) -> None:
    """A condition's status, reason and message say the same thing."""
    if found["type"] == "Ready":
        ready, wanted = found["message"].split(" ")[0].split("/")
        assert (found["status"] == "True") == (ready == wanted != "0"), found
        assert found["reason"] == ("PodsReady" if found["status"] == "True" else "PodsNotReady"), found
    if found["type"] == "MetricsAvailable" and found["reason"] == "WindowMeasured":
        assert found["status"] == "True" and "last window" in found["message"], found


def test_status_reads_well_from_fresh_to_degraded(kube, namespace, tmp_path) -> None:
    operator = OperatorProcess(kube.kubeconfig, tmp_path / "operator", {
        "SLOTUNE_PROMETHEUS_URL": NO_PROMETHEUS_YET, "SLOTUNE_UNSCHEDULABLE_GRACE_S": "2"})
    missing_pvc = {"model": {"name": "m", "source": "pvc://models/llama"}, "tuning": LONG_WINDOW}
    with operator:
        apply(kube, tunedmodel("fresh", namespace, tuning=LONG_WINDOW))
        apply(kube, tunedmodel("degraded", namespace, **missing_pvc))
        ready = wait_for(lambda: (c := condition(get(kube, "tm", "fresh", namespace), "Ready"))
                         and c["status"] == "True" and c, 90, "fresh Ready", describe=operator.log_tail)
        degraded = wait_for(lambda: (c := condition(get(kube, "tm", "degraded", namespace), "Degraded"))
                            and c["status"] == "True" and c, 90, "Degraded", describe=operator.log_tail)


    # Fresh: Ready with the numbers that make it so; no window yet, so metrics are neither there nor missing.
    assert ready["message"] == "2/2 pods ready"
    fresh = get(kube, "tm", "fresh", namespace)
    for found in fresh["status"]["conditions"]:
        agree(found)
    metrics = condition(fresh, "MetricsAvailable")
    assert (metrics["status"], metrics["reason"]) == ("Unknown", "NoWindowYet"), metrics
    reasons = [e["reason"] for e in events(kube, namespace, "fresh")]
    assert "Restarting" not in reasons and "Deployed" in reasons, reasons

    # Degraded: the scheduler's words once, the rule named, no metrics claimed.
    assert degraded["message"].count("not found") == 1, degraded
    assert 'persistentvolumeclaim "models" not found' in degraded["message"]
    assert condition(get(kube, "tm", "degraded", namespace), "MetricsAvailable")["status"] == "Unknown"
    shown = [line for line in describe(kube, "degraded", namespace).splitlines() if "State:  " not in line]
    text = "\n".join(shown)  # all but the loop's own saved state (JSON for the operator, not for people)
    assert "not found. not found" not in text and "WindowMeasured" not in text, text

    # Measured and converged: statuses as the operator writes them, printed by kubectl.
    apply(kube, tunedmodel("measured", namespace, tuning=LONG_WINDOW))
    apply(kube, tunedmodel("converged", namespace, tuning=LONG_WINDOW))
    start = TuningState.initial(RuntimeConfig(max_num_seqs=32, replicas=2))
    measured = start.evolve(phase=Phase.MEASURING, iteration=1, slo_met=False,
                            observed=observed(7399.999999999999, 38.26666666666667, 412), message="window judged")
    write_status(kube, "measured", namespace, measured)
    converged = measured.record(kept_change()).evolve(phase=Phase.CONVERGED, iteration=2, slo_met=True,
                                                      observed=observed(49.000000000001, 18.94999999, 900),
                                                      message="every SLO held")
    write_status(kube, "converged", namespace, converged)

    measured_row = row(kube, "measured", namespace)
    assert measured_row.split()[1:5] == ["Measuring", "false", "7400", "38.3"], measured_row
    converged_row = row(kube, "converged", namespace)
    assert converged_row.split()[1:5] == ["Converged", "true", "49", "18.9"], converged_row
    assert "99999" not in measured_row + converged_row
    fresh_row = row(kube, "fresh", namespace)
    assert fresh_row.split()[1] in ("Measuring", "Deploying"), fresh_row

    text = describe(kube, "measured", namespace)
    assert "WindowMeasured" in text and "last window: 412 requests" in text, text
    text = describe(kube, "converged", namespace)
    assert "202x faster, interval x0.0025..x0.01" in text, text
    assert "p=1.000" not in text and "7399.99" not in text and "1234.56789" not in text, text


def test_validate_refuses_the_infinite_target_kubectl_refuses(kube, namespace, tmp_path) -> None:
    from slotune.cli import main

    manifest = tmp_path / "inf.yaml"
    manifest.write_text(f"""apiVersion: slotune.io/v1alpha1
kind: TunedModel
metadata: {{name: endless, namespace: {namespace}}}
spec:
  model: {{name: m, source: hf://o/m}}
  hardware: {{accelerator: cpu, count: 0}}
  slo: {{ttft: {{p99: .inf}}}}
""")
    refused = kube.kubectl("create", "--dry-run=server", "-f", str(manifest), check=False)
    assert refused.returncode != 0 and get(kube, "tm", "endless", namespace) is None, refused.stdout
    assert main(["validate", "-o", "none", str(manifest)]) == 1
