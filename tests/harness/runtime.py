"""Real `python -m gpu_runtime serve` processes on loopback ports for tests: started, waited for, read, stopped."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from slotune.backends.processes import LaunchSpec, RuntimeProcess

ADMIN_TOKEN = "test-admin-token"


class RuntimeServer:
    """One runtime process serving `model` (a checkpoint directory or builtin://PRESET); whoever starts it stops it.
    Launched the way local mode launches them (slotune.backends.processes), in fp32 for exact comparisons."""

    def __init__(self, model: str | Path, workdir: Path, flags: tuple[str, ...] = (), served_model_name: str = "tiny",
                 env: Mapping[str, str] | None = None) -> None:
        token_file = workdir / "admin-token"
        token_file.write_text(ADMIN_TOKEN)
        spec = LaunchSpec(str(model), served_model_name, (), token_file, workdir, extra_args=("--dtype", "float32",
                          *flags), env=tuple((env or {}).items()))
        self._runtime = RuntimeProcess(spec, index=0)
        self.port, self.url, self.log_path = self._runtime.port, self._runtime.url, self._runtime.log_path
        self._runtime.wait_healthy()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def alive(self) -> bool:
        return self._runtime.alive() and httpx.get(f"{self.url}/health", timeout=5).status_code == 200

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample in /metrics (summed over samples matching the labels given)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        total, found = 0.0, False
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    total, found = total + sample.value, True
        if not found:
            raise KeyError(f"{name} {labels} not in /metrics")
        return total

    def metric_labels(self, name: str) -> dict[str, str]:
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name:
                    return dict(sample.labels)
        raise KeyError(name)

    def stop(self) -> None:
        self._runtime.stop(timeout_s=15)
