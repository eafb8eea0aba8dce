"""The demo as a benchmark: one real `slotune tune examples/local-tiny.yaml` run, timed, its report kept.

The README's demo table and run time are rendered from bench/results/demo.json (bench/readme_numbers.py), so they
come from a run this script made, never from a number typed by hand. Writes bench/results/demo.{json,md} and the
run's SLO plot as bench/results/demo.png.

    .venv/bin/python -m bench.bench_demo [--example examples/local-tiny.yaml]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).parent / "results"


def run_demo(example: Path, run_dir: Path) -> float:
    """Run the tuner as `make demo` does (minus the live view, which needs a terminal); returns wall seconds."""
    started = time.monotonic()
    command = [sys.executable, "-m", "slotune.cli", "tune", str(example), "--out", str(run_dir), "--no-live"]
    subprocess.run(command, check=True)
    return time.monotonic() - started


def machine() -> dict[str, object]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "?")
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", type=Path, default="examples/local-tiny.yaml")
    args = parser.parse_args()
    # A fresh run directory: runs/NAME may hold an earlier run's state, and the demo must start from the file's config.
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        elapsed_s = run_demo(args.example, run_dir)
        report = json.loads((run_dir / "report.json").read_text())
        report_md = (run_dir / "report.md").read_text()
        OUT.mkdir(exist_ok=True)
        shutil.copyfile(run_dir / "slo.png", OUT / "demo.png")
    where = machine()
    load_average = os.getloadavg()[0]
    body = {"example": str(args.example), "elapsed_s": round(elapsed_s, 1), "machine": where,
            "load_average_1m_end": load_average, "report": report}
    (OUT / "demo.json").write_text(json.dumps(body, indent=1) + "\n")
    footer = (f"\nWhole run: {elapsed_s:.0f} s wall clock (`slotune tune {args.example}`), on {where['cpu']} "
              f"({where['cores']} cores); 1-minute load average at the end: {load_average:.1f}.\n")
    (OUT / "demo.md").write_text(report_md + footer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
