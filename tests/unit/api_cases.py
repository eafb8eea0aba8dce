"""The invalid-TunedModel table shared by the loader's unit tests and the API server's integration tests."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
BASE = ROOT / "examples" / "chat-h100.yaml"


@dataclass(frozen=True)
class InvalidCase:
    name: str
    manifest: dict[str, Any]
    path: str
    python_message: str
    server_message: str


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: mappings merge, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def invalid_cases() -> list[InvalidCase]:
    base = yaml.safe_load(BASE.read_text())
    rows = yaml.safe_load((Path(__file__).parent / "tunedmodel_invalid_cases.yaml").read_text())
    cases = []
    for row in rows:
        manifest = merge_patch(base, row["patch"])
        manifest["metadata"] = {"name": row.get("metadataName", row["name"])}  # a case may be about the name
        cases.append(InvalidCase(row["name"], manifest, row["path"], row.get("python", row.get("message")),
                                 row.get("server", row.get("message"))))
    return cases


@dataclass(frozen=True)
class DegradedCase:
    """A TunedModel the API server accepts that the operator must end `Degraded`, its message naming `path`."""

    name: str
    manifest: dict[str, Any]
    path: str
    message: str


# kwok runs no containers, so no pod answers /admin/config: the operator must not wait on one to read back.
KWOK_TUNING = {"spec": {"tuning": {"hotReconfigure": False, "windowSeconds": 5, "warmupSeconds": 0,
                                   "cooldownSeconds": 0}}}


def degraded_cases() -> list[DegradedCase]:
    base = merge_patch(yaml.safe_load(BASE.read_text()), KWOK_TUNING)
    rows = yaml.safe_load((Path(__file__).parent / "tunedmodel_degraded_cases.yaml").read_text())
    cases = []
    for row in rows:
        manifest = merge_patch(base, row["patch"])
        manifest["metadata"] = {"name": row["name"]}
        cases.append(DegradedCase(row["name"], manifest, row["path"], row["message"]))
    return cases
