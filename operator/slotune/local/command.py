"""`slotune tune FILE`: the tuning loop against runtime processes on this machine, no cluster needed.

The same TunedModel file the operator takes; the same `slotune.loop.Tuner`. Local mode drives the declared workload
itself, shows a live view, and leaves a report (markdown, JSON, PNG) and the runtimes' logs in the run directory.
Ctrl-C (or SIGTERM) stops every runtime process before exiting.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import shutil
import signal
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.live import Live

from slotune.api import InvalidTunedModel, Phase, TunedModel, TuningMode, load_tunedmodel
from slotune.local.measurement import LocalMeasurement
from slotune.local.model_config import model_config
from slotune.local.replicas import LocalReplicas, ReplicaSettings
from slotune.local.report import ReportWriter
from slotune.local.trace_segment import TraceSegment
from slotune.local.view import render
from slotune.loop import FileStateStore, Tuner, TuningProblem, TuningState
from slotune.manifests.resources import slo_bucket_edges
from slotune.perfmodel.model_profile import ModelProfile
from slotune.quality import QualityGate
from slotune.traces import TraceReplay


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="a TunedModel YAML file (with spec.workload: local mode drives it)")
    parser.add_argument("--model", help="a local checkpoint directory or GGUF file, instead of spec.model.source")
    parser.add_argument("--out", type=Path, help="run directory for state, logs and report (default runs/NAME)")
    parser.add_argument("--prometheus-url", help="read server-side metrics from this Prometheus instead of scraping")
    parser.add_argument("--max-windows", type=int, help="stop after this many windows (default: 4x maxIterations)")
    parser.add_argument("--resume", action="store_true", help="continue from the state file of an earlier run")
    parser.add_argument("--no-live", action="store_true", help="print one line per window instead of a live view")
    parser.add_argument("--trace", type=Path, help="replay this Azure CSV or Mooncake JSONL trace segment window by "
                        "window instead of generating spec.workload's requests (spec.workload still warms up)")
    parser.add_argument("--trace-rate", type=float, help="time-scale the segment to this mean req/s (this CPU's)")
    parser.add_argument("--trace-start-s", type=float, default=0.0, help="segment start, trace seconds")
    parser.add_argument("--trace-duration-s", type=float, default=600.0, help="segment length, trace seconds")
    parser.add_argument("--max-prompt-tokens", type=int,
                        help="cut the trace's prompts to this (default: maxModelLen less the output cut)")
    parser.add_argument("--max-output-tokens", type=int,
                        help="cut the trace's outputs to this (default: a quarter of maxModelLen)")


def runtime_args(model: TunedModel) -> tuple[str, ...]:
    """The runtime flags the spec sets, as the operator renders them: histogram edges at the SLO targets too, so
    the share of requests within a target is counted from the server side as well as by the client."""
    spec = model.spec
    args = [f"--dtype={spec.model.dtype.value}"]
    if spec.model.max_model_len is not None:
        args.append(f"--max-model-len={spec.model.max_model_len}")
    if edges := slo_bucket_edges(spec.slo):
        args.append(f"--slo-bucket-edges={edges}")
    return (*args, *spec.runtime.extra_args)


class LocalRun:
    """One `slotune tune` run: replicas, measurement, state file and tuner, wired together."""

    def __init__(self, model: TunedModel, source: str, out: Path, prometheus_url: str | None, resume: bool,
                 segment: TraceSegment | None = None) -> None:
        if model.spec.workload is None:
            raise SystemExit(f"{model.metadata.name}: local mode drives spec.workload itself; the file has none")
        self.model, self.out = model, out
        self.replicas = LocalReplicas(ReplicaSettings(
            model=source, served_model_name=model.spec.model.name, work_dir=out,
            extra_args=runtime_args(model), hot_reconfigure=model.spec.tuning.hot_reconfigure,
        ))
        self.measurement = LocalMeasurement(model.spec.workload, lambda: self.replicas.urls, model.spec.model.name,
                                            prometheus_url, warmup_s=model.spec.tuning.warmup_s,
                                            changed_at_s=lambda: self.replicas.changed_at_s, segment=segment)
        self.segment = segment
        self.store = FileStateStore(out / "state.json")
        if not resume and self.store.path.exists():
            self.store.path.unlink()
        # Probe-set references live in the run directory, so a resumed run can still judge a change it made.
        if not resume:
            shutil.rmtree(out / "quality", ignore_errors=True)
        self.quality = QualityGate(model.spec.quality, lambda: self.replicas.urls, model.spec.model.name,
                                   out / "quality")
        self.source = source

    def start(self) -> TuningState | None:
        """Start the first config's runtimes; a state describing the failure when they do not come up."""
        initial = self.model.spec.initial_config()
        resumed = self.store.load()
        result = self.replicas.apply(resumed.current if resumed else initial)
        if result.ok:
            return None
        failed = TuningState.initial(initial).evolve(phase=Phase.DEGRADED, message=result.reason)
        self.store.save(failed)
        return failed

    def tuner(self) -> Tuner:
        profile = ModelProfile.from_hf_config(model_config(self.source), name=self.model.spec.model.name)
        problem = TuningProblem.from_spec(self.model.spec, profile)
        return Tuner(problem, self.replicas, self.measurement, self.store, quality=self.quality)

    def stop(self) -> None:
        self.replicas.stop()


def _loop(run: LocalRun, max_windows: int, live: Live | None, console: Console, report: ReportWriter
          ) -> TuningState:
    tuner = run.tuner()
    # Reported from the start, so Ctrl-C finds the PNG drawn (the first step already measures a window).
    report.write((run.store.load() or TuningState.initial(run.model.spec.initial_config())).to_status())
    state = run.store.load() or tuner.step()
    report.write(state.to_status())
    name, spec = run.model.metadata.name, run.model.spec
    for _ in range(max_windows):
        if state.at_rest and run.segment is None:  # converged replicas are right-sized first (trims), as on Kubernetes
            break
        if run.segment is not None and run.segment.done:  # a replayed segment runs to its end, at rest or not
            break
        if spec.tuning.mode is TuningMode.OFF and state.iteration >= 1:
            break
        warmup = f"{spec.tuning.warmup_s:.0f} s warm-up, then " if run.measurement.warming_up() else ""
        activity = (f"{warmup}measuring a {spec.tuning.window_s:.0f} s window under {spec.workload.profile.value} "
                    "load ...")
        if live is not None:
            live.update(render(name, spec, state.to_status(), activity))
        state = _step(tuner)
        report.write(state.to_status())
        if live is not None:
            live.update(render(name, spec, state.to_status()))
        else:
            console.print(_line(state))
    return state


def _step(tuner: Tuner) -> TuningState:
    """One step that judges a window: a step that only says when to come back (a cooldown) is waited out here,
    since local mode has nothing else to do meanwhile."""
    state = tuner.step()
    while tuner.wake_at_s is not None and not state.at_rest:
        time.sleep(max(0.0, tuner.wake_at_s - time.time()))
        state = tuner.step()
    return state


def _line(state: TuningState) -> str:
    status = state.to_status()
    observed = status.observed
    numbers = "" if observed is None else (
        f" ttft p99 {observed.ttft.p99_ms or 0:.0f} ms, tpot p99 {observed.tpot.p99_ms or 0:.1f} ms,"
        f" {observed.generation_tokens_per_s:.0f} tok/s")
    return f"[{status.iteration}] {status.phase.value}:{numbers} | {status.message}"


def _on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # the same clean shutdown as Ctrl-C


def run(args: argparse.Namespace) -> int:
    console = Console()
    try:
        model = load_tunedmodel(args.file)
    except (InvalidTunedModel, OSError) as error:
        console.print(f"[red]{error}[/red]")
        return 2
    out = args.out or Path("runs") / model.metadata.name
    source = args.model or model.spec.model.source
    segment = trace_segment(args, model)
    max_windows = args.max_windows or (segment.num_windows(model.spec.tuning.window_s) if segment
                                       else 4 * model.spec.tuning.max_iterations)
    signal.signal(signal.SIGTERM, _on_sigterm)
    local = LocalRun(model, source, out, args.prometheus_url, args.resume, segment)
    report = ReportWriter(model, out)
    state: TuningState | None = None
    interrupted = False
    try:
        with console.status(f"starting {model.spec.replicas} runtime(s) for {source} ..."):
            state = local.start()
        if state is None:
            view = contextlib.nullcontext() if args.no_live else Live(console=console, refresh_per_second=2)
            with view as live:
                state = _loop(local, max_windows, live, console, report)
    except KeyboardInterrupt:
        interrupted = True
        console.print("[yellow]interrupted: stopping the runtimes[/yellow]")
    finally:
        local.stop()
    state = local.store.load() or state
    if state is None:
        return 130 if interrupted else 1
    _report(console, report, state, segment, out)
    # The process ends next: the interpreter's final garbage collection of this heap (pydantic, numpy, matplotlib)
    # costs ~0.6 s of CPU that the OS would free anyway; frozen objects are skipped (measured 0.6 s -> 0.07 s).
    gc.freeze()
    if interrupted:
        return 130
    return 0 if state.phase in (Phase.CONVERGED, Phase.INFEASIBLE) or model.spec.tuning.mode is TuningMode.OFF else 1


def _report(console: Console, report: ReportWriter, state: TuningState, segment: TraceSegment | None,
            out: Path) -> None:
    """The run's report files, and the trace replay's attainment and replica-seconds when it replayed one."""
    files = report.write(state.to_status())
    console.print(_summary(state), f"report: {files.markdown}  {files.plot}  {files.json}", sep="\n")
    if segment is not None:
        with files.markdown.open("a") as markdown:
            markdown.write("\n" + segment.markdown())
        console.print(segment.markdown(), f"trace replay: {segment.write(out)}", sep="\n")


def trace_segment(args: argparse.Namespace, model: TunedModel) -> TraceSegment | None:
    if args.trace is None:
        return None
    # Without cuts a request must still fit the model: outputs get a quarter of maxModelLen, prompts the rest.
    limit = model.spec.model.max_model_len
    max_output = args.max_output_tokens or (limit // 4 if limit else None)
    max_prompt = args.max_prompt_tokens or (limit - max_output if limit and max_output else None)
    replay = TraceReplay(args.trace, rate_per_s=args.trace_rate, start_s=args.trace_start_s,
                         duration_s=args.trace_duration_s, max_prompt_tokens=max_prompt, max_output_tokens=max_output)
    return TraceSegment.load(replay, model.spec.slo)


def _summary(state: TuningState) -> str:
    status = state.to_status()
    text = f"{status.phase.value} after {status.iteration} window(s): {status.message}"
    if state.infeasible is not None:
        text += "\nneeds: " + "; ".join(state.infeasible.needs)
    if status.config is not None:
        text += f"\nconfig: {status.config.describe()}"
    return text


def main() -> int:  # `python -m slotune.local.command FILE`, handy in tests
    parser = argparse.ArgumentParser(prog="slotune tune")
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())

