"""Serving metrics for a fleet of deployments kwok runs no containers for: the scale test's and benchmark's stand-in.

kwok's pods run nothing, so the operator's PromQL would find no series. This exporter serves, for each registered
deployment, vLLM's metric names under `/metrics/<index>` (prometheus_client registries, tests/unit/metrics_fake_vllm),
and a background thread finishes requests at a steady rate with latencies well inside the targets the fleet's
TunedModels declare. Prometheus scrapes each path as its own target, labelled with the namespace and deployment a
ServiceMonitor would give the pods, so the operator reads it exactly as it reads real runtimes. The operator's
behaviour at scale is what is under test, not the runtime's.

Cheap enough for a thousand targets on two cores: every deployment of one model sees the same traffic, so they share
one registry, rendered once per traffic tick into bytes that every scrape of that model's targets is answered with
(a scrape no longer renders ~190 samples, and traffic no longer costs a loop over the members). The server is
asyncio (aiohttp, which kopf already brings) on a socket with a deep backlog: a thread-per-request server with
socketserver's backlog of 5 refused connections when Prometheus' scrapes of a thousand targets bunched up.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tests.harness.prometheus import Target
from tests.unit.metrics_fake_vllm import FakeVllm

BACKLOG = 4096  # pending connections the kernel holds for us: more than the targets that can scrape at once


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
    model: str


class FleetExporter:
    def __init__(self, requests_per_s: float = 4.0, tick_s: float = 0.5) -> None:
        self.requests_per_s = requests_per_s
        self.tick_s = tick_s
        self.members: list[Member] = []
        self.scrapes = 0  # answered, so a caller can see Prometheus reached us
        self._servers: dict[str, FakeVllm] = {}  # one per model: its deployments share its traffic
        self._bodies: dict[str, bytes] = {}  # the exposition each model's targets answer with, this tick
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(BACKLOG)
        self._loop = asyncio.new_event_loop()
        self._threads = [threading.Thread(target=self._serve, name="fleet-http", daemon=True),
                         threading.Thread(target=self._traffic, name="fleet-traffic", daemon=True)]

    @property
    def address(self) -> str:
        host, port = self._socket.getsockname()[:2]
        return f"{host}:{port}"

    def add(self, namespace: str, deployment: str, model: str) -> Target:
        with self._lock:
            if model not in self._servers:
                server = FakeVllm(model=model)
                server.finish(ttft_s=0.0005, e2e_s=0.001, prompt_tokens=1)  # every series exists before any window
                self._servers[model] = server
                self._bodies[model] = generate_latest(server.registry)
            self.members.append(Member(namespace, deployment, model))
            index = len(self.members) - 1
        labels = {"namespace": namespace, "deployment": deployment, "__metrics_path__": f"/metrics/{index}"}
        return Target(self.address, labels)

    def start(self) -> FleetExporter:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        for thread in self._threads:
            thread.join(timeout=10)
        self._socket.close()

    def _traffic(self) -> None:
        owed = 0.0
        while not self._stop.wait(self.tick_s):
            owed += self.requests_per_s * self.tick_s
            count, owed = int(owed), owed - int(owed)
            with self._lock:
                servers = dict(self._servers)
            for model, server in servers.items():
                for _ in range(count):  # TTFT 50 ms, TPOT 20 ms: every fleet SLO holds, so nothing is reconfigured
                    server.finish(ttft_s=0.05, e2e_s=0.11, prompt_tokens=200, output_tokens=4, queue_s=0.01)
                body = generate_latest(server.registry)
                with self._lock:
                    self._bodies[model] = body

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get("/metrics/{index}", self._answer)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.SockSite(runner, self._socket, backlog=BACKLOG).start())
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(runner.cleanup())
            self._loop.close()

    async def _answer(self, request: web.Request) -> web.Response:
        """The classic text format whatever Prometheus negotiates (prometheus_client escapes ':' in OpenMetrics,
        which would rename every vllm: metric; the runtime serves text format too)."""
        index = request.match_info["index"]
        with self._lock:
            member = self.members[int(index)] if index.isdigit() and int(index) < len(self.members) else None
            body = self._bodies.get(member.model) if member else None
        if body is None:
            raise web.HTTPNotFound()
        self.scrapes += 1
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
