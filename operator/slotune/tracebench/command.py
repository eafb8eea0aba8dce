"""`slotune bench-traces`: the trace benchmark on any Azure-CSV or Mooncake-JSONL trace file.

With only `--trace` it runs the model/accelerator pairs of the committed results (tracebench.case.PAIRS) at their
load for that trace's format; `--model`/`--accelerator` (and the other flags) run one pair of your choosing instead.
Cases run in `--jobs` processes.
"""

from __future__ import annotations

import argparse
import multiprocessing
import platform
import time
from pathlib import Path

from slotune.slo import SLOSpec
from slotune.tracebench.case import AZURE_SLO, MOONCAKE_SLO, PAIRS, SEGMENT_S, Pair, TraceCase, TraceLoad, cases_for
from slotune.tracebench.report import write
from slotune.tracebench.run import CaseResult, run_case
from slotune.traces import TraceFormat, detect_format


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", type=Path, action="append", required=True,
                        help="trace file (Azure CSV or Mooncake JSONL); repeat for several")
    parser.add_argument("--format", choices=[f.value for f in TraceFormat], help="trace format (default: detected)")
    parser.add_argument("--model", help="perfmodel model profile, e.g. llama-3.1-8b (default: the committed pairs)")
    parser.add_argument("--accelerator", default="nvidia-h100-80gb", help="accelerator profile (with --model)")
    parser.add_argument("--tensor-parallel", type=int, default=1, help="GPUs per replica (with --model)")
    parser.add_argument("--slo", help="targets in ms, e.g. ttft.p99=2000,tpot.p99=100 (default: per format)")
    parser.add_argument("--rate", type=float, help="target mean arrival rate in req/s (default: the pair's)")
    parser.add_argument("--start-s", type=float, default=0.0, help="segment start, trace seconds")
    parser.add_argument("--duration-s", type=float, default=SEGMENT_S, help="segment length, trace seconds")
    parser.add_argument("--startup-s", type=float, default=120.0, help="replica start-up delay (with --model)")
    parser.add_argument("--max-replicas", type=int, default=12, help="most replicas any strategy may use")
    parser.add_argument("--max-prompt-tokens", type=int, help="cut longer prompts to this")
    parser.add_argument("--max-output-tokens", type=int, help="cut longer outputs to this")
    parser.add_argument("--no-slotune", action="store_true", help="baselines only")
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once, one process each")
    parser.add_argument("--out", type=Path, required=True, help="folder for traces.json, traces.md and the plots")


def parse_slo(text: str) -> SLOSpec:
    """`ttft.p99=2000,tpot.p99=100` -> SLOSpec."""
    body: dict[str, dict[str, float]] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        metric, _, percentile = name.partition(".")
        if not value or not percentile:
            raise argparse.ArgumentTypeError(f"--slo wants metric.pNN=ms pairs, got {part!r}")
        body.setdefault(metric, {})[percentile] = float(value)
    return SLOSpec.model_validate(body)


def build_cases(args: argparse.Namespace) -> list[TraceCase]:
    cases = []
    for trace in args.trace:
        trace_format = TraceFormat(args.format) if args.format else detect_format(trace)
        if args.model is None:
            found = cases_for(trace, trace_format, PAIRS)
        else:
            slo = AZURE_SLO if trace_format is TraceFormat.AZURE else MOONCAKE_SLO
            load = TraceLoad(args.rate or 1.0, slo)
            found = cases_for(trace, trace_format, (Pair(args.model, args.accelerator, args.tensor_parallel,
                                                         args.startup_s, args.max_replicas,
                                                         {trace_format: load}),))
        for case in found:
            changes: dict[str, object] = {}
            if args.slo:
                changes["slo"] = parse_slo(args.slo)
            if args.rate:
                changes["rate_per_s"] = args.rate
            for name in ("max_prompt_tokens", "max_output_tokens"):
                if getattr(args, name) is not None:
                    changes[name] = getattr(args, name)
            case = case.with_load(**changes) if changes else case
            cases.append(TraceCase(case.trace, case.trace_format, case.model, case.accelerator,
                                   case.tensor_parallel, case.startup_s, case.max_replicas, case.load,
                                   args.start_s, args.duration_s))
    return cases


def _run(job: tuple[TraceCase, bool]) -> CaseResult:
    case, started = job[0], time.monotonic()
    result = run_case(case, with_slotune=job[1])
    print(f"{case.trace.name}: {case.model} on {case.accelerator}: {time.monotonic() - started:.0f} s", flush=True)
    return result


def run_cases(cases: list[TraceCase], with_slotune: bool, jobs: int) -> list[CaseResult]:
    work = [(case, with_slotune) for case in cases]
    if jobs <= 1 or len(cases) == 1:
        return [_run(job) for job in work]
    with multiprocessing.get_context("spawn").Pool(min(jobs, len(cases))) as pool:
        return pool.map(_run, work, chunksize=1)


def machine() -> str:
    return f"{platform.processor() or platform.machine()}, {multiprocessing.cpu_count()} cores, " \
           f"Python {platform.python_version()}"


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    cases = build_cases(args)
    results = run_cases(cases, not args.no_slotune, args.jobs)
    for path in write(results, args.out, machine(), time.monotonic() - started):
        print(path)
    return 0
