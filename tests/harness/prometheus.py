"""A real Prometheus server (the Debian package) on loopback, scraping the targets a test names.

Targets can be added while it runs (file-based service discovery, re-read every second), which is how the end-to-end
harness registers runtime processes under their pods' labels.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from tests.harness.ports import free_port


@dataclass(frozen=True)
class Target:
    address: str  # host:port serving /metrics
    labels: dict[str, str] = field(default_factory=dict)


class Prometheus:
    def __init__(self, workdir: Path, scrape_interval_s: float = 1.0) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed; run hack/install-system-deps.sh (make test does)")
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._targets_file = workdir / "targets.json"
        self._targets: list[Target] = []
        self.set_targets([])
        interval = f"{int(scrape_interval_s * 1000)}ms"
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [{
                "job_name": "slotune-test",
                "file_sd_configs": [{"files": [str(self._targets_file)], "refresh_interval": "1s"}],
            }],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self._log = open(workdir / "prometheus.log", "wb")  # noqa: SIM115 - lives as long as the process
        self._process = subprocess.Popen(
            [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 300) -> None:
        """Until /-/ready answers; a Prometheus that exits fails at once with its log. The deadline is only a net
        for one that hangs: a loaded machine slows the start, it does not stop it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self._process.returncode}: {self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"prometheus did not become ready: {self.log_tail()}")

    def log_tail(self, num_chars: int = 2000) -> str:
        return (self.workdir / "prometheus.log").read_text(errors="replace")[-num_chars:]

    def set_targets(self, targets: list[Target]) -> None:
        self._targets = list(targets)
        groups = [{"targets": [t.address], "labels": t.labels} for t in self._targets]
        tmp = self._targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(self._targets_file)  # atomic, so Prometheus never reads half a file

    def add_target(self, target: Target) -> None:
        self.set_targets([*self._targets, target])

    def query(self, promql: str) -> list[dict]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        response.raise_for_status()
        return response.json()["data"]["result"]

    def active_targets(self) -> list[dict]:
        response = httpx.get(f"{self.url}/api/v1/targets", timeout=10)
        response.raise_for_status()
        return response.json()["data"]["activeTargets"]

    def wait_for_scrapes(self, timeout_s: float = 120) -> None:
        """Block until every configured target has been scraped successfully at least once (the deadline is a net
        for a target that never answers; scrapes run every interval however loaded the machine is)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self._process.returncode}: {self.log_tail()}")
            active = self.active_targets()
            if len(active) >= len(self._targets) and all(t["health"] == "up" for t in active):
                return
            time.sleep(0.3)
        raise TimeoutError(f"targets not all up: {self.active_targets()}")

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()
