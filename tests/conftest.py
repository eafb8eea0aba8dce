"""Session fixtures for the real parts the tests run against: a kwok control plane, Prometheus, helm."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness.cores import holding
from tests.harness.prometheus import Prometheus, Target

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "hack"))

import kwok_cluster  # noqa: E402  (hack/ is scripts, not a package)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns xdist_group marks into scheduling groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _one_control_plane(items)
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def _one_control_plane(items: list[pytest.Item]) -> None:
    """With two pytest-xdist workers (`make test` runs `-n 2 --dist loadgroup`) every test on the real control plane
    goes to one of them, one after another on one cluster, while the other takes the rest: the wall time halves
    (11:24 against 20:26 of tests, 1,344 tests). Two such runs passed, one of them beside the trace benchmark's two
    simulation processes (14:22). A session before saw 2 timing-bound e2e tests fail in one of two such runs: a
    test that fails beside a busy neighbour is a bug in the test or the product, to fix, not a reason to run
    serially. A test marked `cores` runs alone (pytest_runtest_protocol below): its tolerance for the cores
    slowing after it calibrated is stated and tested, and its own suite is the one neighbour it can remove."""
    group = pytest.mark.xdist_group("control-plane")
    for item in items:
        if "kube" in getattr(item, "fixturenames", ()):
            item.add_marker(group)


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outermost: pytest-timeout's clock starts once the lock is held
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A `cores` test runs while no other test of this run does (tests/harness/cores.py); the lock lives in the
    checkout's pytest cache, which every xdist worker of the run shares (`-p no:cacheprovider`: the checkout)."""
    directory = item.config.cache.mkdir("cores") if hasattr(item.config, "cache") else ROOT / ".pytest-cores"
    with holding(directory, exclusive=item.get_closest_marker("cores") is not None):
        return (yield)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def kube() -> Iterator[kwok_cluster.Cluster]:
    """A real control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok) with fake GPU nodes.

    Named after this session and owned by it, in the shared cluster workdir: parallel sessions coexist, and the
    next `up` anywhere reaps the cluster of a session that was killed (SIGKILL skips every teardown). SIGTERM is
    turned into the interrupt pytest already handles, so a terminated session still tears its cluster down.
    """
    cluster = kwok_cluster.Cluster(f"slotune-test-{os.getpid()}", kwok_cluster.DEFAULT_WORKDIR,
                                   kwok_cluster.binaries())
    previous = signal.getsignal(signal.SIGTERM)
    if previous == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()
        if previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="session")
def helm_binary() -> Path:
    path = kwok_cluster.tools_dir() / "helm"
    if not path.exists():
        raise RuntimeError("helm is not installed; run hack/install-system-deps.sh (make test does)")
    return path


@pytest.fixture
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Prometheus]]:
    """Factory: prometheus(targets=[("127.0.0.1:PORT", {"label": "v"})], scrape_interval_s=1) -> a running server."""
    started: list[Prometheus] = []

    def start(targets: list[tuple[str, dict[str, str]]] = (), scrape_interval_s: float = 1.0) -> Prometheus:
        server = Prometheus(tmp_path_factory.mktemp("prometheus"), scrape_interval_s)
        started.append(server)
        server.set_targets([Target(address, dict(labels)) for address, labels in targets])
        return server

    yield start
    for server in started:
        server.stop()
