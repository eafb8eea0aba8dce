"""The extra-pod canary (slotune.backends.kube_canary_pod) as the loop and the manifest see it: the loop keeps the
change an unapplied intent while the extra pod starts, then verifies it as a canary named in status.canary, and a
promotion ends the canary before the main Deployment rolls; the canary Deployment is the candidate's, one replica,
its pods marked so the main Deployment's pod list leaves them out, and only where maxReplicas leaves room."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from slotune.api.status import Verdict, Verification
from slotune.backends.kube_canary_pod import CANARY_POD_LABEL, build_canary_deployment, room_for_one_more
from slotune.knobs import RuntimeConfig
from slotune.loop import ApplyResult
from slotune.manifests.resources import config_from_annotation, selector_labels
from slotune.metrics.per_pod import ArmWindows
from slotune.settings import OperatorSettings
from tests.unit.test_loop_canary import NEW, OLD, _tuner, _window
from tests.unit.test_resources import tunedmodel


@dataclass
class ExtraPod:
    """Main pods that never change during the canary; the extra pod takes `starting` ticks to be Ready."""

    starting: int = 2
    applied: list[RuntimeConfig] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    extra: RuntimeConfig | None = None
    windows: int = 0

    def apply(self, config: RuntimeConfig) -> ApplyResult:
        changed = bool(self.applied) and self.applied[-1] != config
        self.applied.append(config)
        return ApplyResult.success(changed=changed)

    def ready(self) -> bool:
        return True

    def start_canary(self, running: RuntimeConfig, candidate: RuntimeConfig) -> object:
        self.extra = candidate
        if self.starting:
            self.starting -= 1
            return SimpleNamespace(pod="", result=ApplyResult.rolling_out("starting the canary pod"))
        return SimpleNamespace(pod="extra-0", result=ApplyResult.success(changed=True))

    def end_canary(self) -> None:
        self.events.append(f"end {len(self.applied)}")
        self.extra = None

    def measure(self, window_s: float) -> object:
        self.windows += 1
        return _window(1.0, 600, self.windows)

    def arms(self, canary_pod: str) -> ArmWindows:
        assert canary_pod == "extra-0"
        return ArmWindows(canary_pod, _window(0.5, 200, 100 + self.windows), ("p0", "p1", "p2"),
                          _window(1.0, 600, 200 + self.windows))


def test_the_change_waits_for_the_extra_pod_then_is_verified_and_promoted() -> None:
    pods = ExtraPod()
    tuner, _ = _tuner(pods)  # type: ignore[arg-type]
    pods.applied.append(OLD)
    for _ in range(2):
        state = tuner.step()
        assert state.pending is not None and not state.pending.applied and state.changes_applied == 0
        assert "starting the canary pod" in state.message and state.to_status().canary is None
    state = tuner.step()
    assert state.pending is not None and state.pending.canary_pod == "extra-0" and state.running == OLD
    status = state.to_status()
    assert status.canary is not None and (status.canary.pod, status.canary.config) == ("extra-0", NEW)
    assert pods.applied[-1] == OLD and NEW not in pods.applied  # the main pods never ran the candidate meanwhile
    state = tuner.step()
    assert state.current == NEW and state.history[0].verdict is Verdict.KEPT
    assert state.history[0].verification is Verification.CANARY
    # The canary ended (its Deployment deleted) before the main Deployment was asked to roll to the candidate.
    ended = int(pods.events[0].split()[1])
    assert pods.applied[ended:][0] == NEW and NEW not in pods.applied[:ended]


def test_the_canary_deployment_is_the_candidates_one_pod_marked_as_the_canary() -> None:
    tm = tunedmodel(replicas=2, tuning={"hotReconfigure": False, "bounds": {"maxReplicas": 3}})
    backend = SimpleNamespace(tm=tm, settings=OperatorSettings())
    candidate = RuntimeConfig(max_num_seqs=64, replicas=2)
    manifest = build_canary_deployment(backend, candidate, "secret-uid")  # type: ignore[arg-type]
    assert manifest["metadata"]["name"] == "chat-canary" and manifest["spec"]["replicas"] == 1
    assert config_from_annotation(manifest) == candidate.with_changes(replicas=1)
    assert "--max-num-seqs=64" in manifest["spec"]["template"]["spec"]["containers"][0]["args"]
    labels = manifest["spec"]["template"]["metadata"]["labels"]
    assert labels.items() >= selector_labels("chat").items()  # the Service selects it: traffic splits over N + 1
    assert labels[CANARY_POD_LABEL] == "true" and manifest["spec"]["selector"]["matchLabels"][CANARY_POD_LABEL]
    (owner,) = manifest["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("TunedModel", "1234-uid")  # collected with the TunedModel


def test_an_extra_pod_needs_room_under_max_replicas() -> None:
    def room(spec: dict[str, object], replicas: int) -> bool:
        backend = SimpleNamespace(tm=tunedmodel(**spec), settings=OperatorSettings())
        return room_for_one_more(backend, RuntimeConfig(replicas=replicas))  # type: ignore[arg-type]

    assert room({"replicas": 2, "tuning": {"bounds": {"maxReplicas": 3}}}, 2)
    assert not room({"replicas": 3, "tuning": {"bounds": {"maxReplicas": 3}}}, 3)
    assert not room({"replicas": 2}, 2)  # maxReplicas absent: spec.replicas, no room
