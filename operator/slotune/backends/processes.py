"""Runtime processes on the local machine: start `python -m gpu_runtime serve`, wait until it serves, stop it.

Each process runs in its own session (process group), so stopping it also stops anything it spawned, and an
`atexit` hook plus the owner's signal handling make sure no runtime outlives `slotune tune`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

_LIVE: set[subprocess.Popen] = set()


def _kill_all() -> None:
    for process in list(_LIVE):
        _stop_group(process, timeout_s=5)


atexit.register(_kill_all)


def _stop_group(process: subprocess.Popen, timeout_s: float) -> None:
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=timeout_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    _LIVE.discard(process)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RuntimeFailed(RuntimeError):
    """The runtime exited or never became healthy; `log_tail` holds its last output."""

    def __init__(self, message: str, log_tail: str) -> None:
        super().__init__(f"{message}\n--- runtime log (tail) ---\n{log_tail}")
        self.log_tail = log_tail


@dataclass(frozen=True)
class LaunchSpec:
    """Everything one runtime process needs; args come from RuntimeConfig.engine_args()."""

    model_path: str
    served_model_name: str
    engine_args: tuple[str, ...]
    admin_token_file: Path
    log_dir: Path
    extra_args: tuple[str, ...] = ()
    num_threads: int = 1
    env: tuple[tuple[str, str], ...] = ()  # extra environment, e.g. GPU_RUNTIME_STEP_TRACE for a benchmark


class RuntimeProcess:
    def __init__(self, spec: LaunchSpec, index: int) -> None:
        self.spec = spec
        self.index = index
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = spec.log_dir / f"runtime-{index}-{self.port}.log"
        command = [
            sys.executable, "-m", "gpu_runtime", "serve", "--model", spec.model_path,
            "--served-model-name", spec.served_model_name, "--host", "127.0.0.1", "--port", str(self.port),
            "--device", "cpu", "--num-threads", str(spec.num_threads),
            "--admin-token-file", str(spec.admin_token_file), *spec.engine_args, *spec.extra_args,
        ]
        spec.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                env=os.environ | {"OMP_NUM_THREADS": str(spec.num_threads), "TOKENIZERS_PARALLELISM": "false"}
                | dict(spec.env),
            )
        _LIVE.add(self.process)

    def log_tail(self, num_lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_healthy(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeFailed(f"runtime {self.index} exited with {self.process.returncode}", self.log_tail())
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeFailed(f"runtime {self.index} not healthy after {timeout_s:.0f} s", self.log_tail())

    def stop(self, timeout_s: float = 10.0) -> None:
        _stop_group(self.process, timeout_s)
