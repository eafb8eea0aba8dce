"""Speculative decoding speedup on CPU: batch 1 and 32 concurrent requests, repetitive and random workloads.

Workloads (same model shapes, so the same cost per forward pass):
- repetitive (summarization-like): a successor model (gpu_runtime.speculative.checkpoints) whose greedy continuation
  repeats the prompt, the regime where prompt lookup pays off; each prompt is a rotation of a 64-token cycle, twice.
- random: the random-weight checkpoint on random-token prompts; drafts are almost never right, so this measures the
  price of speculating when it does not pay.
Methods: off, ngram (k=4, lookup 1..3), draft_model (k=4, a 1-layer truncated draft of the target, same tokenizer).
Rounds alternate every (workload, concurrency, method) cell so machine noise hits all alike; speedups are ratios of
medians measured side by side in one run.

    .venv/bin/python bench/bench_speculative.py [--preset tiny] [--rounds 5] [--max-tokens 64]

Writes bench/results/speculative.json and bench/results/speculative.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from gpu_runtime.checkpoint.builtin import PRESETS, build_checkpoint
from gpu_runtime.config import EngineConfig, SamplingParams, SchedulerKnobs
from gpu_runtime.engine.llm_engine import LLMEngine
from gpu_runtime.speculative.checkpoints import build_successor_model, build_truncated_draft, cycle_successor
from gpu_runtime.speculative.config import SpecMethod, SpeculativeSettings

RESULTS = Path(__file__).resolve().parent / "results"
CYCLE_LEN = 64
CONCURRENCIES = (1, 32)
METHODS = ("off", "ngram", "draft_model")
K = 4


@dataclass(frozen=True)
class Run:
    workload: str
    method: str
    concurrency: int
    tokens: int
    wall_s: float
    cpu_s: float  # this process's CPU time: robust to other work on a shared machine (one torch thread)
    draft_tokens: int
    accepted_tokens: int
    drafts: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.tokens / self.cpu_s


@dataclass(frozen=True)
class Workload:
    name: str
    engine: LLMEngine
    draft_dir: Path
    prompts: list[list[int]]


def machine() -> dict[str, object]:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")), "?")
    return {"cpu_model": model, "cpu_cores": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "torch_threads": torch.get_num_threads()}


def build_workloads(workdir: Path, preset: str, max_requests: int) -> list[Workload]:
    target = build_checkpoint(workdir / preset, preset)
    vocab = PRESETS[preset].vocab_size
    cycle = list(range(300, 300 + CYCLE_LEN))
    successor = build_successor_model(target, workdir / "successor", cycle_successor(vocab, cycle))
    repetitive = [(cycle[i % CYCLE_LEN :] + cycle[: i % CYCLE_LEN]) * 2 for i in range(max_requests)]
    gen = torch.Generator().manual_seed(0)
    random_prompts = [torch.randint(2, vocab, (2 * CYCLE_LEN,), generator=gen).tolist() for _ in range(max_requests)]
    knobs = SchedulerKnobs(max_num_seqs=max(CONCURRENCIES))
    return [
        Workload("repetitive", _engine(successor, knobs), build_truncated_draft(successor, workdir / "d_succ", 1),
                 repetitive),
        Workload("random", _engine(target, knobs), build_truncated_draft(target, workdir / "d_target", 1),
                 random_prompts),
    ]


def _engine(path: Path, knobs: SchedulerKnobs) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), dtype="float32", device="cpu", knobs=knobs,
                                  kv_cache_memory_bytes=256 << 20))


def _settings(method: str, draft_dir: Path) -> SpeculativeSettings | None:
    if method == "ngram":
        return SpeculativeSettings(SpecMethod.NGRAM, K, prompt_lookup_min=1, prompt_lookup_max=3)
    if method == "draft_model":
        return SpeculativeSettings(SpecMethod.DRAFT_MODEL, K, draft_model=str(draft_dir))
    return None


def run_once(work: Workload, method: str, concurrency: int, max_tokens: int, tag: str) -> Run:
    engine = work.engine
    engine.set_speculative(_settings(method, work.draft_dir))
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    before = engine.stats()
    start, cpu_start = time.perf_counter(), time.process_time()
    for i, prompt in enumerate(work.prompts[:concurrency]):
        engine.add_request(f"{tag}-{i}", prompt, params)
    tokens = 0
    while engine.has_unfinished_requests():
        tokens += sum(len(out.new_token_ids) for out in engine.step())
    wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    after = engine.stats()
    return Run(work.name, method, concurrency, tokens, wall_s, cpu_s,
               after.spec_num_draft_tokens - before.spec_num_draft_tokens,
               after.spec_num_accepted_tokens - before.spec_num_accepted_tokens,
               after.spec_num_drafts - before.spec_num_drafts)


def summarize(runs: list[Run]) -> list[dict[str, object]]:
    rows = []
    for workload in ("repetitive", "random"):
        for concurrency in CONCURRENCIES:
            cell = [r for r in runs if r.workload == workload and r.concurrency == concurrency]
            base = statistics.median(r.tokens_per_s for r in cell if r.method == "off")
            base_cpu = statistics.median(r.tokens_per_cpu_s for r in cell if r.method == "off")
            for method in METHODS:
                mine = [r for r in cell if r.method == method]
                draft_tokens = sum(r.draft_tokens for r in mine)
                drafts = sum(r.drafts for r in mine)
                accepted = sum(r.accepted_tokens for r in mine)
                tok_s = statistics.median(r.tokens_per_s for r in mine)
                tok_cpu_s = statistics.median(r.tokens_per_cpu_s for r in mine)
                rows.append({
                    "workload": workload, "concurrency": concurrency, "method": method,
                    "tokens_per_s": round(tok_s, 1), "speedup": round(tok_s / base, 3),
                    "tokens_per_cpu_s": round(tok_cpu_s, 1), "speedup_cpu": round(tok_cpu_s / base_cpu, 3),
                    "acceptance_rate": round(accepted / draft_tokens, 3) if draft_tokens else None,
                    "mean_acceptance_length": round(1 + accepted / drafts, 2) if drafts else None,
                })
    return rows


def write_results(rows: list[dict[str, object]], runs: list[Run], args: argparse.Namespace) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": "speculative_decoding", "machine": machine(), "device": "cpu",
              "model": f"{args.preset} preset shapes, fp32", "num_speculative_tokens": K, "max_tokens": args.max_tokens,
              "rounds": args.rounds, "summary": rows,
              "runs": [asdict(r) | {"tokens_per_s": r.tokens_per_s, "tokens_per_cpu_s": r.tokens_per_cpu_s}
                       for r in runs]}
    (RESULTS / "speculative.json").write_text(json.dumps(result, indent=2) + "\n")
    m = result["machine"]
    lines = [
        "# Speculative decoding on CPU", "",
        f"Machine: {m['cpu_model']}, {m['cpu_cores']} cores, torch {m['torch']}, {m['torch_threads']} torch thread(s). "
        f"Model: {result['model']}; k = {K}; {args.max_tokens} greedy output tokens per request; median of "
        f"{args.rounds} interleaved rounds. Speedup = output tokens/s with speculation / without, same cell; "
        "wall clock, and per CPU second of this process (the steadier figure while other work shares the cores).",
        "",
        "| workload | concurrency | method | tokens/s (wall) | speedup (wall) | tokens/CPU-s | speedup (CPU) "
        "| acceptance rate | mean acceptance length |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['workload']} | {r['concurrency']} | {r['method']} | {r['tokens_per_s']} | {r['speedup']} | "
              f"{r['tokens_per_cpu_s']} | {r['speedup_cpu']} | "
              f"{r['acceptance_rate'] if r['acceptance_rate'] is not None else '-'} | "
              f"{r['mean_acceptance_length'] if r['mean_acceptance_length'] is not None else '-'} |" for r in rows]
    lines += ["", "Repetitive uses a successor model whose continuation repeats the prompt (an upper bound on what",
              "prompt lookup can find); random uses random weights and prompts (drafts are wasted work). Real text",
              "sits in between: the tuner should read these as the two ends of the acceptance range.", ""]
    (RESULTS / "speculative.md").write_text("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    workloads = build_workloads(Path(tempfile.mkdtemp(prefix="bench-spec-")), args.preset, max(CONCURRENCIES))
    for work in workloads:  # warm-up: first calls allocate and load; not recorded
        for method in METHODS:
            run_once(work, method, max(CONCURRENCIES), 4, f"warmup-{work.name}-{method}")
    runs: list[Run] = []
    for round_index in range(args.rounds):
        for work in workloads:
            for concurrency in CONCURRENCIES:
                for method in METHODS:
                    tag = f"{round_index}-{work.name}-{concurrency}-{method}"
                    run = run_once(work, method, concurrency, args.max_tokens, tag)
                    runs.append(run)
                    print(f"{tag}: {run.tokens_per_s:.1f} tok/s, accepted {run.accepted_tokens}/{run.draft_tokens}")
    rows = summarize(runs)
    write_results(rows, runs, args)
    print((RESULTS / "speculative.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
