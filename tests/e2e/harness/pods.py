"""What the e2e tests ask of pods the kubelet stand-in runs, and of a backend applying configs to them."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from slotune.loop import ApplyResult
from tests.e2e.harness.kubelet import KubeletStandIn


def settle(call: Callable[[], ApplyResult]) -> ApplyResult:
    """Ask as the operator's ticks would, until the backend's answer is not 'in progress'. The backend itself ends
    the wait (done, hopeless, or its own rollout and admin-connect deadlines), so no clock of the test's decides."""
    while (result := call()).in_progress:
        time.sleep(0.5)
    return result


def seqs(kubelet: KubeletStandIn) -> dict[str, int]:
    """Each serving pod's live max_num_seqs, read from the pod (GET /admin/config)."""
    return {pod: config["max_num_seqs"] for pod, config in kubelet.live_configs().items()}


def live_seqs(kubelet: KubeletStandIn) -> dict[str, int]:
    """seqs(), or {} while a pod's process is going away under the read."""
    try:
        return seqs(kubelet)
    except httpx.HTTPError:
        return {}
