"""`slotune validate FILE`: check TunedModel manifests the way the API server would, without a cluster.

Prints each resource with every default filled in, or, for a refused one, each bad field by its path and the rule it
broke (`spec.tuning.bounds.maxReplicas: maxReplicas must be at least spec.replicas`), and exits 1.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import yaml

from slotune.api import InvalidTunedModel, load_tunedmodels


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="YAML file with one or more TunedModel documents ('-' for stdin)")
    parser.add_argument("-o", "--output", choices=("yaml", "json", "none"), default="yaml",
                        help="how to print the valid resources with defaults filled in (default: yaml)")


def run(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if str(args.file) == "-" else _read(args.file)
    if text is None:
        return 2
    if (unrepresentable := non_finite(text)) is not None:
        print(f"error: {unrepresentable}", file=sys.stderr)
        return 1
    try:
        models = load_tunedmodels(text)
    except InvalidTunedModel as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    documents = [m.wire() for m in models]
    if args.output == "yaml":
        sys.stdout.write(yaml.safe_dump_all(documents, sort_keys=False))
    elif args.output == "json":
        print(json.dumps(documents[0] if len(documents) == 1 else documents, indent=2))
    return 0


def non_finite(text: str) -> str | None:
    """The first number JSON cannot carry (.inf, .nan), by its path: kubectl sends JSON, so the API server never
    accepts one, while pydantic would read `.inf` as a valid, endless target."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError:
        return None  # load_tunedmodels reports the syntax error
    for document in documents:
        if (found := _non_finite(document, "")) is not None:
            path, value = found
            shown = yaml.safe_dump(value).splitlines()[0]
            return (f"{path.lstrip('.')}: {shown} is not a finite number (the API server reads JSON, which has no "
                    "infinity or NaN)")
    return None


def _non_finite(value: Any, path: str) -> tuple[str, float] | None:
    if isinstance(value, float) and not math.isfinite(value):
        return path, value
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        if (found := _non_finite(child, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}")) is not None:
            return found
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError as error:
        print(f"error: cannot read {path}: {error.strerror}", file=sys.stderr)
        return None
