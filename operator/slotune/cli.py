"""The `slotune` command: one subcommand per job, each implemented in the module that owns it.

A subcommand module exposes `add_arguments(parser)` and `run(args) -> int`; it is imported only when used, so
`slotune crd` does not pay for matplotlib or kopf.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    name: str
    module: str
    help: str


COMMANDS = (
    Command("tune", "slotune.local.command", "tune a TunedModel file against local runtime processes"),
    Command("bench", "slotune.loadgen.command", "drive a workload against an OpenAI-compatible server"),
    Command("bench-tuner", "slotune.tunerbench.command", "compare tuning strategies on simulated scenarios"),
    Command("operator", "slotune.controller.command", "run the Kubernetes operator"),
    Command("crd", "slotune.commands.crdgen", "print or write the TunedModel CRD generated from the API models"),
    Command("api-docs", "slotune.commands.apidocs", "print or write the TunedModel field reference in markdown"),
    Command("validate", "slotune.commands.validate", "check a TunedModel file and print it with defaults filled in"),
)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    return int(importlib.import_module(args._module).run(args) or 0)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slotune", description="Makes LLM serving meet its latency SLOs.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = argv[0] if argv else None
    for command in COMMANDS:
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help)
        sub.set_defaults(_module=command.module)
        if command.name == chosen:
            importlib.import_module(command.module).add_arguments(sub)
    return parser


if __name__ == "__main__":
    sys.exit(main())
