"""`make bench` / `python -m bench`: every benchmark, one after another, each writing JSON + markdown under
bench/results/. Benchmarks are measurements, not tests: run them on a quiet machine and read the ratios.

    python -m bench                 # all
    python -m bench engine server   # some
"""

from __future__ import annotations

import subprocess
import sys
import time

# Name -> command; each writes its own results. The tuner benchmark is the CLI's (`slotune bench-tuner`).
BENCHMARKS = {
    "engine": [sys.executable, "-m", "bench.bench_engine"],
    "server": [sys.executable, "-m", "bench.bench_server"],
    "speculative": [sys.executable, "-m", "bench.bench_speculative"],
    "quant": [sys.executable, "-m", "bench.bench_quant"],
    "tuner": [sys.executable, "-m", "slotune.cli", "bench-tuner", "--scenarios", "bench/scenarios"],
}


def main(argv: list[str]) -> int:
    chosen = argv or list(BENCHMARKS)
    unknown = [name for name in chosen if name not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}", file=sys.stderr)
        return 2
    failed = []
    for name in chosen:
        started = time.monotonic()
        print(f"== {name}", flush=True)
        code = subprocess.call(BENCHMARKS[name])  # a process each: one benchmark's threads never slow the next
        print(f"== {name}: exit {code} in {time.monotonic() - started:.0f} s", flush=True)
        if code:
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
