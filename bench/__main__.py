"""`make bench` / `python -m bench`: every benchmark, one after another, each writing JSON + markdown under
bench/results/, then the README's numbers rendered from those results (bench/readme_numbers.py). Every benchmark
runs with its defaults, which are the parameters the committed results were made with, so a rerun repeats the same
experiment. Benchmarks are measurements, not tests: run them on a quiet machine and read the ratios.

    python -m bench                 # all, then the README
    python -m bench engine server   # some, then the README
"""

from __future__ import annotations

import subprocess
import sys
import time

from bench import readme_numbers

# Name -> command; each writes its own results. The tuner benchmark is the CLI's (`slotune bench-tuner`).
BENCHMARKS = {
    "engine": [sys.executable, "-m", "bench.bench_engine"],
    "server": [sys.executable, "-m", "bench.bench_server"],
    "speculative": [sys.executable, "-m", "bench.bench_speculative"],
    "quant": [sys.executable, "-m", "bench.bench_quant"],
    "real-model": [sys.executable, "-m", "bench.bench_real_model"],
    "simulator": [sys.executable, "-m", "bench.validate_simulator"],
    "demo": [sys.executable, "-m", "bench.bench_demo"],
    "tuner": [sys.executable, "-m", "slotune.cli", "bench-tuner", "--scenarios", "bench/scenarios"],
    "traces": [sys.executable, "-m", "bench.bench_traces"],
    "operator-scale": [sys.executable, "-m", "bench.bench_operator_scale"],
    "canary": [sys.executable, "-m", "bench.bench_canary"],
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
    # The README follows whatever results are on disk now, including those a failed benchmark left unchanged.
    print("== readme-numbers", flush=True)
    return 1 if failed or readme_numbers.main([]) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
