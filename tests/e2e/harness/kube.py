"""Small waits and reads on the test control plane, through kubectl (the tests check what a user would see)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
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
