"""The watch cache of the operator's children against a real API server: a tick's Deployment and Secret reads cost
no request once it synced, a write is read back at once (never the version before it), other writers' changes and
deletions arrive through the watch, and a watch that breaks lists again."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from slotune.api import parse_tunedmodel
from slotune.backends.kube_api import API_REQUESTS, KubeAPI
from slotune.backends.kube_cache import ChildCache
from slotune.backends.kube_deployment import KubernetesBackend
from slotune.controller.status import Health, StatusStateStore
from slotune.loop.state import TuningState
from slotune.settings import OperatorSettings
from tests.e2e.harness.kube import apply, get, install_tunedmodel_crd, scratch_namespace
from tests.integration.test_operator import tunedmodel


@pytest.fixture
def namespace(kube) -> Iterator[str]:
    install_tunedmodel_crd(kube)
    with scratch_namespace(kube, "cache") as name:
        yield name


def requests_sent() -> float:
    return sum(sample.value for metric in API_REQUESTS.collect() for sample in metric.samples
               if sample.name.endswith("_total"))


def until(check: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    """The watch's delivery is the API server's: wait for it, up to a bound far beyond a busy machine's."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.05)


def test_ticks_read_children_from_the_watch_and_never_older_than_their_own_writes(kube, namespace) -> None:
    manifest = tunedmodel("cached", namespace, runtime={"engine": "vllm"}, tuning={"mode": "off"})
    apply(kube, manifest)
    tm = parse_tunedmodel(get(kube, "tunedmodel", "cached", namespace))
    api = KubeAPI.from_environment(str(kube.kubeconfig))
    api.children = cache = ChildCache(api.credentials, (namespace,)).start()
    backend = KubernetesBackend(api, tm, OperatorSettings())
    try:
        assert cache.wait_synced(120)
        initial = tm.spec.initial_config()
        backend.deploy(initial)
        before = requests_sent()
        for _ in range(20):  # what ticks read: no request at all
            assert backend.deployed_config() == initial
            assert backend.admin_token()
        assert requests_sent() == before

        scaled = initial.with_changes(replicas=2)
        backend.scale(scaled)  # the write's answer is what the next read sees, not the watch's older event
        deployment = backend.deployment()
        assert deployment is not None and deployment["spec"]["replicas"] == 2
        assert backend.deployed_config() == scaled

        # Another writer (the Deployment controller) reaches the cache through the watch.
        until(lambda: (backend.deployment() or {}).get("status", {}).get("observedGeneration", 0)
              >= (backend.deployment() or {})["metadata"]["generation"], "the controller's status")

        # A deleted Secret is gone from the cache, so the tick rotates it; the new one is read back at once.
        old = backend.admin_token()
        kube.kubectl("delete", "secret", "-n", namespace, backend.names.secret)
        until(lambda: backend._secret() is None, "the Secret's deletion")
        assert backend.rotate_deleted_token()
        assert backend.admin_token() != old
    finally:
        cache.stop()
        api.close()


def test_a_watch_that_ends_resumes_and_one_that_breaks_lists_again_and_catches_up(kube, namespace) -> None:
    manifest = tunedmodel("relisted", namespace, runtime={"engine": "vllm"}, tuning={"mode": "off"})
    apply(kube, manifest)
    tm = parse_tunedmodel(get(kube, "tunedmodel", "relisted", namespace))
    api = KubeAPI.from_environment(str(kube.kubeconfig))
    api.children = cache = ChildCache(api.credentials, (namespace,), watch_s=1).start()  # watches end every 1 s
    try:
        assert cache.wait_synced(120)
        deployments = cache.of("Deployment", namespace)
        assert deployments is not None
        KubernetesBackend(api, tm, OperatorSettings()).deploy(tm.spec.initial_config())
        started = deployments.watches
        until(lambda: deployments.watches >= started + 2, "a resumed watch")
        kube.kubectl("annotate", "deployment", "-n", namespace, "relisted-runtime", "seen=after-resume")
        until(lambda: "seen" in (cache_get(deployments, namespace)), "a change after the resume")

        # The next watch breaks (the API server's connection drops): the cache lists again and catches up with
        # what changed meanwhile.
        broken, real_watch = [], deployments._watch

        def breaks_once(version: str) -> str | None:
            if not broken:
                broken.append(version)
                kube.kubectl("annotate", "deployment", "-n", namespace, "relisted-runtime", "while=broken")
                raise ConnectionError("connection reset")
            return real_watch(version)

        deployments._watch = breaks_once  # type: ignore[method-assign]
        until(lambda: deployments.relists >= 1, "a relist")
        until(lambda: "while" in cache_get(deployments, namespace), "the change made while the watch was down")
    finally:
        cache.stop()
        api.close()


def cache_get(deployments, namespace: str) -> dict[str, str]:
    return ((deployments.get(namespace, "relisted-runtime") or {}).get("metadata") or {}).get("annotations") or {}


def test_the_same_status_is_written_once_and_a_change_is_written(kube, namespace) -> None:
    """A tick that changes nothing sends nothing: at 1,000 TunedModels every status write is a request the API
    server serves for nothing."""
    apply(kube, tunedmodel("quiet", namespace, runtime={"engine": "vllm"}, tuning={"mode": "off"}))
    tm = parse_tunedmodel(get(kube, "tunedmodel", "quiet", namespace))
    api = KubeAPI.from_environment(str(kube.kubeconfig))
    store = StatusStateStore(api, tm, lambda: Health(ready=True))
    try:
        state = TuningState.initial(tm.spec.initial_config())
        store.save(state)
        before = requests_sent()
        store.save(state)
        assert requests_sent() == before
        store.save(state.evolve(message="measuring something new"))
        assert requests_sent() == before + 1
        assert get(kube, "tunedmodel", "quiet", namespace)["status"]["message"] == "measuring something new"
    finally:
        api.close()


def test_a_stopped_watch_ends_at_once_and_closes_its_own_connection(kube, namespace) -> None:
    """stop() used to close the client under a watch blocked reading: its file descriptor went to the next connection
    opened while the old reader was still in recv, and that reader's next recv took the new connection's TLS records
    (DECRYPTION_FAILED_OR_BAD_RECORD_MAC in this file, once). Now the blocked read is woken through its socket and
    the watch thread, the connection's only user, closes it; the thread ends at once, not at the watch's timeout."""
    api = KubeAPI.from_environment(str(kube.kubeconfig))
    cache = ChildCache(api.credentials, (namespace,)).start()  # watches of 300 s: blocked reading until stopped
    try:
        assert cache.wait_synced(120)
        watching = list(cache._caches)
        until(lambda: all(c._reading is not None for c in watching), "every watch reading")
        assert cache.stop(timeout_s=30), "a watch thread outlived stop()"
        assert all(not c._thread.is_alive() for c in watching)
        # New connections (which would take the freed descriptors) work, and nothing reads them but their owner.
        for _ in range(20):
            assert api.get(f"/api/v1/namespaces/{namespace}") is not None
    finally:
        cache.stop()
        api.close()
