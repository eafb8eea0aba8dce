"""The one canary-capable fake backend the unit tests share: replicas whose configs the test reads back, with a canary
run as the Kubernetes backend runs one (backends.kube_canary, backends.kube_canary_pod), without a cluster.

A live canary (`extra=False`) is the first pod running the candidate while its siblings keep the running config; an
extra-pod canary (`extra=True`) is one more pod, `extra-0`, that takes `starting` steps to be Ready while the main
pods never change. Each window the canary arm's latencies are the siblings' scaled by `canary_scale` (200 requests
per pod, seeded by the window's number), so a test sets how much better or worse the candidate is. The simulator's
backend has no canaries (its replicas share one config), hence this fake.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from slotune.knobs import RuntimeConfig
from slotune.loop import ApplyResult
from slotune.metrics.per_pod import ArmWindows
from slotune.snapshot import LatencySummary, MetricsSnapshot, Source

PODS = ("p0", "p1", "p2")
EXTRA_POD = "extra-0"
REQUESTS_PER_POD = 200


def window(scale: float, n: int, seed: int) -> MetricsSnapshot:
    """A window of `n` requests with lognormal TTFT around 200 ms x `scale`."""
    samples = np.random.default_rng(seed).lognormal(np.log(200.0), 0.4, n) * scale
    return MetricsSnapshot(Source.SIMULATOR, 10.0, n, ttft=LatencySummary.from_samples(samples))


@dataclass
class CanaryPods:
    start: RuntimeConfig
    canary_scale: float = 1.0  # the canary's latency relative to its siblings'
    endpoint: str | None = None  # the canary pod's OpenAI endpoint the backend names (None: it names none)
    extra: bool = False  # the canary is one extra pod rather than the first of the running ones
    starting: int = 0  # steps an extra pod takes to be Ready
    configs: dict[str, RuntimeConfig] = field(default_factory=dict)  # what each main pod runs now
    ran: dict[str, list[RuntimeConfig]] = field(default_factory=dict)  # every config each main pod was given
    applied: list[RuntimeConfig] = field(default_factory=list)  # every config asked of the backend
    events: list[str] = field(default_factory=list)  # "end N": a canary ended after N applies
    canary: tuple[str, RuntimeConfig] | None = None  # the canary pod and what it runs
    windows: int = 0

    def __post_init__(self) -> None:
        self.configs = self.configs or dict.fromkeys(PODS, self.start)
        self.ran = self.ran or {pod: [config] for pod, config in self.configs.items()}

    def apply(self, config: RuntimeConfig) -> ApplyResult:
        live = self.canary if self.canary is not None and not self.extra else None
        wanted = {pod: live[1] if live and live[0] == pod else config for pod in self.configs}
        changed = wanted != self.configs
        self.configs = wanted
        self.applied.append(config)
        for pod, running in wanted.items():
            self.ran[pod].append(running)
        return ApplyResult.success(changed=changed)

    def ready(self) -> bool:
        return True

    def start_canary(self, running: RuntimeConfig, candidate: RuntimeConfig) -> object:
        if not self.extra:
            self.canary = (PODS[0], candidate)
            return SimpleNamespace(pod=PODS[0], result=self.apply(running), endpoint=self.endpoint)
        if self.starting:
            self.starting -= 1
            return SimpleNamespace(pod="", result=ApplyResult.rolling_out("starting the canary pod"))
        self.canary = (EXTRA_POD, candidate)
        return SimpleNamespace(pod=EXTRA_POD, result=ApplyResult.success(changed=True), endpoint=self.endpoint)

    def end_canary(self) -> None:
        self.events.append(f"end {len(self.applied)}")
        self.canary = None

    def measure(self, window_s: float) -> MetricsSnapshot:
        self.windows += 1
        return window(1.0, REQUESTS_PER_POD * len(PODS), self.windows)

    def arms(self, canary_pod: str) -> ArmWindows:
        siblings = tuple(pod for pod in self.configs if pod != canary_pod)
        return ArmWindows(canary_pod, window(self.canary_scale, REQUESTS_PER_POD, 100 + self.windows), siblings,
                          window(1.0, REQUESTS_PER_POD * len(siblings), 200 + self.windows))
