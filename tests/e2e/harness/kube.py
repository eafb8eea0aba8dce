"""Small waits and reads on the test control plane, through kubectl (the tests check what a user would see)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(check: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.5,
             describe: Callable[[], str] = lambda: "") -> T:
    """Poll until `check()` returns something truthy; fail with `what` and `describe()` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{describe()}")
        time.sleep(interval_s)


def wait_for_progress(count: Callable[[], int], goal: int, stall_s: float, what: str, interval_s: float = 1.0,
                      describe: Callable[[], str] = lambda: "") -> None:
    """Poll until `count()` reaches `goal`; fail only when it made no progress for `stall_s` (a busy machine slows
    progress down, it does not stop it)."""
    best, since = -1, time.monotonic()
    while (now := count()) < goal:
        if now > best:
            best, since = now, time.monotonic()
        elif time.monotonic() - since > stall_s:
            raise AssertionError(f"{what}: stuck at {now}/{goal} for {stall_s:.0f} s\n{describe()}")
        time.sleep(interval_s)


def items(kube: Any, kind: str, namespace: str) -> list[dict[str, Any]]:
    return json.loads(kube.kubectl("get", kind, "-n", namespace, "-o", "json").stdout)["items"]


def get(kube: Any, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    result = kube.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for found in ((obj or {}).get("status") or {}).get("conditions") or []:
        if found["type"] == kind:
            return found
    return None


def apply(kube: Any, manifest: dict[str, Any]) -> None:
    kube.kubectl("apply", "-f", "-", input=json.dumps(manifest))


def events(kube: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.name={name},involvedObject.kind=TunedModel"
    found = kube.kubectl("get", "events", "-n", namespace, "--field-selector", selector, "-o", "json")
    return json.loads(found.stdout)["items"]


ROOT = Path(__file__).resolve().parents[3]


def install_tunedmodel_crd(kube: Any) -> None:
    kube.kubectl("apply", "-f", str(ROOT / "crds" / "tunedmodel.yaml"))
    wait_for(lambda: kube.kubectl("wait", "--for=condition=Established", "crd/tunedmodels.slotune.io",
                                  "--timeout=10s", check=False).returncode == 0, 60, "the CRD")


@contextmanager
def scratch_namespace(kube: Any, prefix: str) -> Iterator[str]:
    """A fresh namespace, deleted afterwards; kopf's finalizers are released first, since the operator that would
    remove them is gone by then. Its TunedModels are gone before this returns: a namespace's deletion runs behind
    the namespace controller's queue, and the next test's operator (watching every namespace) would otherwise adopt
    them (seen: an operator e2e's operator taking on the scale test's 40 TunedModels while its own ran)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    kube.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        for tm in kube.kubectl("get", "tunedmodels", "-n", name, "-o", "name", check=False).stdout.split():
            kube.kubectl("patch", tm, "-n", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                         check=False)
        kube.kubectl("delete", "tunedmodels", "--all", "-n", name, "--timeout=120s", check=False)
        kube.kubectl("delete", "namespace", name, "--wait=false")
