"""The trace benchmark with the committed parameters: both shipped traces (bench/traces/) on the model/accelerator
pairs of `slotune.tracebench.case.PAIRS`, every strategy, two passes, into bench/results/traces.{json,md} and a
`traces-<trace>.png` per trace. Same as `slotune bench-traces --trace bench/traces/azure-llm-2023-conv.csv --trace
bench/traces/mooncake-fast25-conversation.jsonl --out bench/results`.

    python -m bench.bench_traces
"""

from __future__ import annotations

import sys
from pathlib import Path

from slotune import cli

ROOT = Path(__file__).resolve().parent
TRACES = (ROOT / "traces" / "azure-llm-2023-conv.csv", ROOT / "traces" / "mooncake-fast25-conversation.jsonl")


def main(argv: list[str]) -> int:
    args = ["bench-traces", *(a for t in TRACES for a in ("--trace", str(t))), "--out", str(ROOT / "results"), *argv]
    return cli.main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
