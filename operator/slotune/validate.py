"""`slotune validate FILE`: check TunedModel manifests the way the API server would, without a cluster.

Prints each resource with every default filled in, or, for a refused one, each bad field by its path and the rule it
broke (`spec.tuning.bounds.maxReplicas: maxReplicas must be at least spec.replicas`), and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

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


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError as error:
        print(f"error: cannot read {path}: {error.strerror}", file=sys.stderr)
        return None
