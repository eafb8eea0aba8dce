"""A config Degraded because its replicas did not fit is rolled out again when the backend's fit retry is due
(backends.kube_fit): Degraded through the retry and after it while it still does not fit, the message naming the
retry; Measuring once the cluster has room."""

from __future__ import annotations

from dataclasses import dataclass, replace

from slotune.api.status import Phase
from slotune.api.tuning import TuningMode
from slotune.knobs import RuntimeConfig
from slotune.loop import ApplyResult, MemoryStateStore, Tuner
from slotune.simulator.backend import SimulatedDeployment
from slotune.snapshot import MetricsSnapshot
from tests.unit.loop.test_loop_nonblocking import CHAT, H100, POOR, TUNING, _problem


@dataclass
class _Quota:
    """Replicas above `room` do not fit: apply fails as the Kubernetes backend's scale-to-fit does, and `retry_fit`
    asks again only when the test says the backoff is due."""

    inner: SimulatedDeployment
    room: int
    due: bool = False
    retries: int = 0

    def apply(self, config: RuntimeConfig) -> ApplyResult:
        if config.replicas > self.room:
            return ApplyResult.failure(f"scaled to {self.room} of {config.replicas} requested replicas", crashed=True)
        return self.inner.apply(config)

    def ready(self) -> bool:
        return self.inner.ready()

    def measure(self, window_s: float) -> MetricsSnapshot:
        return self.inner.measure(window_s)

    def retry_fit(self, config: RuntimeConfig) -> str | None:
        if not self.due:
            return None
        self.due, self.retries = False, self.retries + 1
        return f"asking for the {config.replicas} requested replicas again (retry {self.retries})"


def test_a_fitted_config_is_rolled_out_again_when_its_retry_is_due() -> None:
    quota = _Quota(SimulatedDeployment(H100, CHAT, requests_per_window=120), room=2)
    off = TUNING.model_copy(update={"mode": TuningMode.OFF})  # the running config stays the one asked for
    problem = replace(_problem(off), initial=POOR.with_changes(replicas=4))
    tuner = Tuner(problem, quota, quota, MemoryStateStore())
    assert tuner.step().phase is Phase.DEGRADED
    assert tuner.step().phase is Phase.DEGRADED and quota.retries == 0  # not due: nothing is asked again

    quota.due = True
    retrying = tuner.step()  # Degraded holds through the retry: the condition does not flap per retry
    assert retrying.phase is Phase.DEGRADED and retrying.rollout == retrying.current and not retrying.at_rest
    assert "requested replicas again (retry 1)" in retrying.message
    still_full = tuner.step()
    assert still_full.phase is Phase.DEGRADED and still_full.rollout is None
    assert still_full.message.startswith("retry failed: scaled to 2 of 4")  # not "initial config failed"
    assert still_full.current.key() in still_full.learned.failed_keys

    quota.room, quota.due = 4, True  # the quota was raised
    assert tuner.step().phase is Phase.DEGRADED
    freed = tuner.step()
    assert freed.phase is Phase.MEASURING and freed.rollout is None
    assert freed.current.replicas == 4 and freed.current.key() not in freed.learned.failed_keys
    assert quota.inner.running == freed.current
