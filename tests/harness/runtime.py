"""Real `python -m gpu_runtime serve` processes on loopback ports for tests: started, waited for, read, stopped."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.ports import free_port

ADMIN_TOKEN = "test-admin-token"


class RuntimeServer:
    """One runtime process serving `model` (a checkpoint directory or builtin://PRESET); whoever starts it stops it."""

    def __init__(self, model: str | Path, workdir: Path, flags: tuple[str, ...] = (), served_model_name: str = "tiny",
                 env: Mapping[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        token_file = workdir / "admin-token"
        token_file.write_text(ADMIN_TOKEN)
        self.log_path = workdir / f"server-{self.port}.log"
        command = [
            sys.executable, "-m", "gpu_runtime", "serve", "--model", str(model), "--served-model-name",
            served_model_name, "--port", str(self.port), "--device", "cpu", "--dtype", "float32", "--num-threads", "1",
            "--admin-token-file", str(token_file), *flags,
        ]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=os.environ | {"OMP_NUM_THREADS": "1"} | dict(env or {}),
            )
        self._wait_healthy()

    def _wait_healthy(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"server not healthy:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def alive(self) -> bool:
        return self.process.poll() is None and httpx.get(f"{self.url}/health", timeout=5).status_code == 200

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
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
