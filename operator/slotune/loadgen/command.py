"""`slotune bench`: drive a workload against OpenAI-compatible servers and write results (JSON + PNG)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from slotune.loadgen.plots import plot_latency_cdfs
from slotune.loadgen.prompts import load_trace
from slotune.loadgen.runner import RunPlan, run_workload
from slotune.loadgen.stats import summarize
from slotune.slo import SLOSpec
from slotune.traces import TraceReplay, recorded_format
from slotune.workload import Arrival, LengthDistribution, Profile, WorkloadSpec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", action="append", required=True, help="server root; repeat for replicas")
    parser.add_argument("--model", help="model id (default: the first of GET /v1/models)")
    parser.add_argument("--profile", choices=[p.value for p in Profile], default="chat")
    parser.add_argument("--rate", type=float, help="requests per second (open-loop arrivals)")
    parser.add_argument("--arrival", choices=[a.value for a in Arrival], help="default: the profile's")
    parser.add_argument("--arrival-cv", type=float, help="burstiness of gamma arrivals")
    parser.add_argument("--concurrency", type=int, help="closed loop with this many in flight (without --rate), or "
                        "a cap on requests in flight")
    parser.add_argument("--prompt-tokens", type=float, nargs=2, metavar=("P50", "P99"))
    parser.add_argument("--output-tokens", type=float, nargs=2, metavar=("P50", "P99"))
    parser.add_argument("--max-prompt-tokens", type=int, help="cut prompts to this length")
    parser.add_argument("--trace", type=Path, help="replay this trace instead of generating requests: slotune's JSONL "
                        "(one request a line: timestamp, prompt or prompt_tokens, output_tokens), an Azure CSV or a "
                        "Mooncake JSONL (format detected)")
    parser.add_argument("--trace-rate", type=float, help="time-scale an Azure/Mooncake trace to this mean req/s")
    parser.add_argument("--trace-start-s", type=float, default=0.0, help="replay from this many trace seconds in")
    parser.add_argument("--trace-duration-s", type=float, help="replay this many trace seconds (before scaling)")
    parser.add_argument("--max-output-tokens", type=int, help="cut a replayed trace's outputs to this length")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--duration-s", type=float, help="stop arrivals after this long (with --trace: optional)")
    length.add_argument("--num-requests", type=int, help="send this many (with --trace: optional, its first N)")
    parser.add_argument("--warmup-requests", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    for metric in ("ttft", "tpot", "e2e"):
        for percentile in (50, 99):
            parser.add_argument(f"--slo-{metric}-p{percentile}-ms", type=float)
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="directory for JSON and PNG")
    parser.add_argument("--no-progress", action="store_true")


def workload_from_args(args: argparse.Namespace) -> WorkloadSpec:
    """The workload the flags describe: the profile's, with every length flag applied before validation (a custom
    profile has no lengths of its own, so it is only valid once they are in)."""
    fields: dict[str, object] = {"profile": args.profile, "request_rate_per_s": args.rate,
                                 "arrival_cv": args.arrival_cv, "concurrency": args.concurrency}
    fields["arrival"] = args.arrival or (Arrival.CONCURRENCY if args.rate is None and args.concurrency else None)
    base = None if args.profile == Profile.CUSTOM else WorkloadSpec.model_validate({"profile": args.profile})
    if base is None and not (args.prompt_tokens and args.output_tokens):
        raise SystemExit("slotune bench: --profile custom needs --prompt-tokens P50 P99 and --output-tokens P50 P99")
    fields["prompt_tokens"] = _lengths(base.prompt if base else None, args.prompt_tokens, args.max_prompt_tokens)
    fields["output_tokens"] = _lengths(base.output if base else None, args.output_tokens, None)
    try:
        return WorkloadSpec.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as error:
        raise SystemExit(f"slotune bench: {error}") from error


def _lengths(base: LengthDistribution | None, p50_p99: list[float] | None, max_tokens: int | None
             ) -> dict[str, float] | None:
    """A length distribution as the flags change it: the profile's (or none), its median and P99, its cut."""
    out: dict[str, float] = base.model_dump() if base else {}
    if p50_p99:
        out |= {"p50": p50_p99[0], "p99": p50_p99[1]}
    if max_tokens:
        out |= {"max": max_tokens, "min": min(out.get("min", 1), max_tokens)}
    return out or None


def trace_replay_from_args(args: argparse.Namespace) -> TraceReplay | None:
    """How to replay an Azure or Mooncake trace (None for slotune's own JSONL, replayed as recorded)."""
    if args.trace is None or recorded_format(args.trace) is None:
        return None
    return TraceReplay(args.trace, rate_per_s=args.trace_rate, start_s=args.trace_start_s,
                       duration_s=args.trace_duration_s, max_prompt_tokens=args.max_prompt_tokens,
                       max_output_tokens=args.max_output_tokens)


def slo_from_args(args: argparse.Namespace) -> SLOSpec | None:
    targets: dict[str, dict[str, float]] = {}
    for metric in ("ttft", "tpot", "e2e"):
        for percentile in (50, 99):
            value = getattr(args, f"slo_{metric}_p{percentile}_ms")
            if value is not None:
                targets.setdefault(metric, {})[f"p{percentile}"] = value
    return SLOSpec.model_validate(targets) if targets else None


def run(args: argparse.Namespace) -> int:
    if args.trace is None and args.duration_s is None and args.num_requests is None:
        raise SystemExit("slotune bench: give --duration-s, --num-requests or --trace")
    trace = load_trace(args.trace, trace_replay_from_args(args)) if args.trace is not None else None
    if trace is not None and not trace:
        raise SystemExit(f"slotune bench: {args.trace} holds no requests")
    spec, slo = workload_from_args(args), slo_from_args(args)
    plan = RunPlan(urls=tuple(args.url), model=args.model, num_requests=args.num_requests,
                   duration_s=args.duration_s, warmup_requests=args.warmup_requests, seed=args.seed,
                   show_progress=not args.no_progress)
    result = asyncio.run(run_workload(spec, plan, trace))
    summary = summarize(result.records, result.duration_s, slo, seed=args.seed)
    workload = {"trace": str(args.trace)} if trace is not None else spec.model_dump(by_alias=True, mode="json")
    out = summary.json() | {"model": result.model, "urls": list(plan.urls), "workload": workload}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(out, indent=2))
    source = args.trace.name if trace is not None else spec.profile
    plot_latency_cdfs(result.records, args.out / "latency_cdf.png", slo, title=f"{result.model}: {source}")
    _print_table(out)
    return 0 if summary.completed > 0 and out.get("slo_met", True) else 1


def _print_table(out: dict[str, object]) -> None:
    table = Table(title="slotune bench")
    table.add_column("metric")
    for column in ("mean", "median", "p99"):
        table.add_column(f"{column} ms", justify="right")
    for key in ("ttft", "tpot", "itl", "e2el"):
        cells = [out.get(f"{c}_{key}_ms") for c in ("mean", "median", "p99")]
        table.add_row(key, *("-" if v is None else f"{v:.1f}" for v in cells))
    console = Console()
    console.print(table)
    console.print(f"completed {out['completed']}, failed {out['failed']}, "
                  f"{out['request_throughput']:.2f} req/s, {out['output_throughput']:.1f} output tok/s")
    if "slo_attainment" in out:
        console.print(f"SLO attainment {out['slo_attainment']:.3f}, met: {out['slo_met']}")
