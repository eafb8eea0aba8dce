"""Serving metrics for a fleet of deployments kwok runs no containers for: the scale test's and benchmark's stand-in.

kwok's pods run nothing, so the operator's PromQL would find no series. This exporter serves, for each registered
deployment, vLLM's metric names under `/metrics/<index>` (prometheus_client registries, tests/unit/metrics_fake_vllm),
and a background thread finishes requests on every one of them at a steady rate with latencies well inside the
targets the fleet's TunedModels declare. Prometheus scrapes each path as its own target, labelled with the namespace
and deployment a ServiceMonitor would give the pods, so the operator reads it exactly as it reads real runtimes. The
operator's behaviour at scale is what is under test, not the runtime's.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.harness.prometheus import Target
from tests.unit.metrics_fake_vllm import FakeVllm, send_text_format


def fleet_tunedmodel(name: str, namespace: str, window_s: float) -> dict[str, Any]:
    """A member of the fleet: CPU pods (kwok needs no GPUs for them), hotReconfigure off (kwok's pods run nothing to
    read back; they run their Deployment's arguments), targets the exporter's latencies always meet."""
    return {
        "apiVersion": "slotune.io/v1alpha1", "kind": "TunedModel",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "fleet", "source": "hf://org/fleet-8b"},
            "hardware": {"accelerator": "cpu", "count": 0},
            "slo": {"ttft": {"p99": 500}, "tpot": {"p99": 50}},
            "replicas": 1,
            "tuning": {"windowSeconds": window_s, "minSamples": 10, "warmupSeconds": 0, "cooldownSeconds": 0,
                       "hotReconfigure": False},
        },
    }


@dataclass(frozen=True)
class Member:
    namespace: str
    deployment: str
    server: FakeVllm


class FleetExporter:
    def __init__(self, requests_per_s: float = 4.0, tick_s: float = 0.5) -> None:
        self.requests_per_s = requests_per_s
        self.tick_s = tick_s
        self.members: list[Member] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._threads = [threading.Thread(target=self._httpd.serve_forever, name="fleet-http", daemon=True),
                         threading.Thread(target=self._traffic, name="fleet-traffic", daemon=True)]

    @property
    def address(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"{host}:{port}"

    def add(self, namespace: str, deployment: str, model: str) -> Target:
        server = FakeVllm(model=model)
        server.finish(ttft_s=0.0005, e2e_s=0.001, prompt_tokens=1)  # every series exists before any window
        with self._lock:
            self.members.append(Member(namespace, deployment, server))
            index = len(self.members) - 1
        labels = {"namespace": namespace, "deployment": deployment, "__metrics_path__": f"/metrics/{index}"}
        return Target(self.address, labels)

    def start(self) -> FleetExporter:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        for thread in self._threads:
            thread.join(timeout=10)

    def _traffic(self) -> None:
        owed = 0.0
        while not self._stop.wait(self.tick_s):
            owed += self.requests_per_s * self.tick_s
            count, owed = int(owed), owed - int(owed)
            with self._lock:
                members = list(self.members)
            for member in members:
                for _ in range(count):  # TTFT 50 ms, TPOT 20 ms: every fleet SLO holds, so nothing is reconfigured
                    member.server.finish(ttft_s=0.05, e2e_s=0.11, prompt_tokens=200, output_tokens=4, queue_s=0.01)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fleet = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                index = self.path.rsplit("/", 1)[-1]
                with fleet._lock:
                    member = fleet.members[int(index)] if index.isdigit() and int(index) < len(fleet.members) else None
                if member is None:
                    self.send_error(404)
                    return
                send_text_format(self, member.server.registry)

            def log_message(self, *_: object) -> None:
                pass

        return Handler
