"""A stand-in for the kubelet of kwok's fake GPU nodes, for the end-to-end test. It is a test harness, nothing more.

kwok marks scheduled pods Running and Ready but runs no containers. This harness watches a TunedModel's pods and, for
each Ready pod, starts a real `python -m gpu_runtime serve` process on this machine's CPU with that pod's container
arguments (only where it listens and where the admin token file is are rewritten: loopback, a free port, a local
copy of the pod's Secret), registers it with a real Prometheus under the labels a ServiceMonitor would give it
(namespace, pod, deployment), and writes the pod -> URL map the operator's SLOTUNE_POD_ENDPOINTS_FILE setting reads,
so the operator's POST /admin/config reaches the process. A pod that goes away (rollout, scale-down) has its process
stopped. The runtime's own behaviour is real; only the placement of the process is simulated.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client

from slotune.backends.processes import LaunchSpec, RuntimeFailed, RuntimeProcess
from tests.harness.prometheus import Prometheus, Target

# --admin-port is dropped: the process serves /admin/config beside its API, at the URL the endpoints file lists.
_REWRITTEN = frozenset({"--model", "--served-model-name", "--host", "--port", "--admin-port", "--admin-token-file"})


@dataclass
class _Pod:
    name: str
    process: RuntimeProcess
    registered: bool = False


def split_args(args: list[str]) -> tuple[dict[str, str], list[str]]:
    """(the flags the harness rewrites, by name; every other argument, in order)."""
    rewritten: dict[str, str] = {}
    rest: list[str] = []
    index = 0
    while index < len(args):
        if args[index] in _REWRITTEN and index + 1 < len(args):
            rewritten[args[index]] = args[index + 1]
            index += 2
            continue
        rest.append(args[index])
        index += 1
    return rewritten, rest


class KubeletStandIn:
    def __init__(self, api_client: Any, namespace: str, tunedmodel: str, prometheus: Prometheus,
                 workdir: Path) -> None:
        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace
        self.tunedmodel = tunedmodel
        self.prometheus = prometheus
        self.workdir = workdir
        self.endpoints_file = workdir / "pod-endpoints.json"
        self.endpoints_file.write_text("{}")
        self.pods: dict[str, _Pod] = {}
        self.started_total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubelet-stand-in", daemon=True)
        self.errors: list[str] = []

    def start(self) -> KubeletStandIn:
        self._thread.start()
        return self

    def urls(self) -> list[str]:
        """The runtimes that serve now. Read from other threads (the load) while this one changes `pods`: the
        values are copied first, in one step under the GIL, so a change never breaks the iteration."""
        return [p.process.url for p in list(self.pods.values()) if p.registered]

    def live_configs(self) -> dict[str, dict[str, Any]]:
        """What each serving pod's runtime answers to GET /admin/config: the knobs it runs, read from the pod.

        Only pods that still serve when asked: this thread's copy of `pods` can name a pod the stand-in's thread
        has just stopped (the extra canary pod ending, a rollout), whose process refuses the connection. Such a pod
        is left out; a pod still listed with a live process that refuses is a real failure and raises."""
        headers = {"Authorization": f"Bearer {self._token()}"}
        found = {}
        for name, pod in list(self.pods.items()):
            if not pod.registered or not pod.process.alive():
                continue
            try:
                found[name] = httpx.get(f"{pod.process.url}/admin/config", headers=headers, timeout=30).json()
            except httpx.TransportError:
                if self.pods.get(name) is pod and pod.process.alive():
                    raise
        return found

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self._sync()
            except Exception as error:  # keep standing in; the test reads `errors` when it fails
                self.errors.append(repr(error))

    def _ready_pods(self) -> dict[str, Any]:
        selector = f"slotune.io/tunedmodel={self.tunedmodel}"
        found = {}
        for pod in self.core.list_namespaced_pod(self.namespace, label_selector=selector).items:
            ready = any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))
            if ready and pod.metadata.deletion_timestamp is None:
                found[pod.metadata.name] = pod
        return found

    def _sync(self) -> None:
        ready = self._ready_pods()
        for name in [n for n in self.pods if n not in ready]:
            self.pods.pop(name).process.stop()
            self._publish()
        for name, pod in ready.items():
            if name not in self.pods:
                self.pods[name] = _Pod(name, self._launch(pod))
                self.started_total += 1
        for entry in self.pods.values():
            if not entry.registered and self._healthy(entry.process):
                entry.registered = True
                self._publish()

    def _healthy(self, process: RuntimeProcess) -> bool:
        if not process.alive():
            raise RuntimeFailed(f"runtime for a pod exited with {process.process.returncode}", process.log_tail())
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{process.url}/health", timeout=1.0).status_code == 200
        return False

    def _launch(self, pod: Any) -> RuntimeProcess:
        (container,) = pod.spec.containers
        rewritten, rest = split_args(list(container.args))
        token_file = self.workdir / f"{pod.metadata.name}.token"
        token_file.write_text(self._token())
        spec = LaunchSpec(model_path=rewritten["--model"], served_model_name=rewritten["--served-model-name"],
                          engine_args=tuple(rest), admin_token_file=token_file, log_dir=self.workdir / "runtimes")
        return RuntimeProcess(spec, self.started_total)

    def _token(self) -> str:
        secret = self.core.read_namespaced_secret(f"{self.tunedmodel}-admin-token", self.namespace)
        return base64.b64decode(secret.data["token"]).decode()

    def _publish(self) -> None:
        live = [p for p in self.pods.values() if p.registered]
        deployment = f"{self.tunedmodel}-runtime"
        self.prometheus.set_targets([
            Target(p.process.url.removeprefix("http://"),
                   {"namespace": self.namespace, "pod": p.name, "deployment": deployment}) for p in live])
        endpoints = {f"{self.namespace}/{p.name}": p.process.url for p in live}
        partial = self.endpoints_file.with_suffix(".tmp")
        partial.write_text(json.dumps(endpoints))
        partial.replace(self.endpoints_file)  # atomic: the operator never reads half a file

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for entry in self.pods.values():
            entry.process.stop()
        self.pods.clear()
