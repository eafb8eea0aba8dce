"""Runtime replicas as local processes: start them, change their knobs (in place through `/admin/config` where the
runtime can, by restart where it cannot), scale them, and stop them all.

A config the runtime refuses, or that makes it crash or never become healthy, is reported as a failed apply with the
runtime's own words; the tuner rolls back and never tries it again.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from slotune.backends.processes import LaunchSpec, RuntimeFailed, RuntimeProcess
from slotune.knobs import RuntimeConfig
from slotune.loop.protocols import ApplyResult


@dataclass(frozen=True)
class ReplicaSettings:
    model: str  # checkpoint directory or builtin://PRESET
    served_model_name: str
    work_dir: Path
    extra_args: tuple[str, ...] = ()
    hot_reconfigure: bool = True
    startup_timeout_s: float = 180.0
    # A runtime asked to stop gets this long for its graceful shutdown before SIGKILL: it holds nothing worth
    # saving, and Ctrl-C must stop local mode within seconds even on a loaded machine.
    stop_grace_s: float = 5.0


class LocalReplicas:
    """The local `Backend` of the tuning loop: N runtime processes on loopback ports."""

    def __init__(self, settings: ReplicaSettings) -> None:
        self.settings = settings
        self.config: RuntimeConfig | None = None
        self._processes: list[RuntimeProcess] = []
        self.changed_at_s: float | None = None  # time.monotonic() of the last change to what runs (None: nothing)
        self._token = secrets.token_urlsafe(24)
        self._token_file = settings.work_dir / "admin-token"
        settings.work_dir.mkdir(parents=True, exist_ok=True)
        self._token_file.write_text(self._token)
        self._token_file.chmod(0o600)

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self._processes]

    def ready(self) -> bool:
        return bool(self._processes) and all(p.alive() for p in self._processes)

    def apply(self, config: RuntimeConfig) -> ApplyResult:
        previous = self.config
        if previous == config and self.ready():
            return ApplyResult.success(changed=False)
        try:
            if previous is None or previous.needs_restart(config) or not self.settings.hot_reconfigure:
                self._restart_all(config)
            else:
                self._reconfigure_live(config)
                self._scale(config)
        except RuntimeFailed as error:
            self.config = None  # whatever runs now is not a config we know; the next apply restarts
            return ApplyResult.failure(str(error), crashed=True)
        except RuntimeRefused as error:
            return ApplyResult.failure(str(error), crashed=False)
        finally:
            self.changed_at_s = time.monotonic()  # even a failed change leaves cold or different runtimes
        self.config = config
        return ApplyResult.success()

    def _launch_spec(self, config: RuntimeConfig) -> LaunchSpec:
        return LaunchSpec(
            model_path=self.settings.model, served_model_name=self.settings.served_model_name,
            engine_args=tuple(config.engine_args()), admin_token_file=self._token_file,
            log_dir=self.settings.work_dir / "logs", extra_args=self.settings.extra_args,
        )

    def _start(self, config: RuntimeConfig, count: int) -> None:
        started = [RuntimeProcess(self._launch_spec(config), len(self._processes) + i) for i in range(count)]
        self._processes += started
        for process in started:
            process.wait_healthy(self.settings.startup_timeout_s)

    def _restart_all(self, config: RuntimeConfig) -> None:
        self.stop()
        self._start(config, config.replicas)

    def _scale(self, config: RuntimeConfig) -> None:
        missing = config.replicas - len(self._processes)
        if missing > 0:
            self._start(config, missing)
        while len(self._processes) > config.replicas:
            self._processes.pop().stop(self.settings.stop_grace_s)

    def _reconfigure_live(self, config: RuntimeConfig) -> None:
        for process in self._processes:
            response = httpx.post(f"{process.url}/admin/config", json=config.admin_payload(), timeout=120,
                                  headers={"Authorization": f"Bearer {self._token}"})
            if response.status_code != 200:
                raise RuntimeRefused(f"runtime {process.index} refused {config.describe()}: {response.text}")
            if not process.alive():
                raise RuntimeFailed(f"runtime {process.index} died applying {config.describe()}", process.log_tail())

    def stop(self) -> None:
        """Stop every runtime at once: each gets the same grace in parallel, so N replicas stop as fast as one."""
        stoppers = [threading.Thread(target=p.stop, args=(self.settings.stop_grace_s,), daemon=True)
                    for p in self._processes]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join()
        self._processes = []


class RuntimeRefused(RuntimeError):
    """The runtime answered /admin/config with an error: the config is invalid for it."""
