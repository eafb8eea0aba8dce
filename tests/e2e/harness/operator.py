"""`slotune operator` as a real subprocess against the test control plane, killable at any moment.

Runs standalone (no peering object), without the liveness port (several operators may run on one host), with a short
tick so tests move quickly. Its log is kept in a file and printed by `log_tail()` when a test fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

STARTED = "Activity 'configure' succeeded"  # kopf's line for slotune's startup handler: imports done, settings read
STARTUP_S = 600


class OperatorProcess:
    def __init__(self, kubeconfig: Path, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.env = {"SLOTUNE_PEERING": "", "SLOTUNE_LIVENESS_ENDPOINT": "", "SLOTUNE_TICK_S": "0.5",
                    "SLOTUNE_ROLLOUT_TIMEOUT_S": "90", "SLOTUNE_LOG_LEVEL": "INFO"} | (env or {})
        self.process: subprocess.Popen | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / f"operator-{self.starts}.log"

    def start(self) -> OperatorProcess:
        self.starts += 1
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = os.environ | {"KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1"} | self.env
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "slotune.cli", "operator"], env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        self._wait_started()
        return self

    def _wait_started(self) -> None:
        """Until the operator's startup handler ran (or the process ended): its imports (kopf, kubernetes, scipy) take
        ~4 s on quiet cores and took over 60 s on a loaded 2-core machine, where a test's 60 s wait for the operator's
        first act then ran out before it had logged a line. Tests time the operator's behaviour, not Python's start."""
        deadline = time.monotonic() + STARTUP_S
        while self.alive() and STARTED not in self.log_path.read_text(errors="replace"):
            if time.monotonic() > deadline:
                raise AssertionError(f"the operator did not start within {STARTUP_S} s\n{self.log_tail()}")
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL: no cleanup, exactly what a crashed or evicted operator pod leaves behind."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, signum: int) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, num_lines: int = 60) -> str:
        lines = []
        for index in range(1, self.starts + 1):
            path = self.workdir / f"operator-{index}.log"
            if path.exists():
                lines += [f"--- operator run {index} ---", *path.read_text(errors="replace").splitlines()[-num_lines:]]
        return "\n".join(lines)

    def __enter__(self) -> OperatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
