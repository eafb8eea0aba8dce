"""Drives a workload against one or more servers: warm-up first (excluded), then the measured run.

Open-loop workloads send each planned request at its arrival time (optionally capped at `max_concurrency` in
flight, the cap delaying sends as vLLM's --max-concurrency does); closed-loop (concurrency) workloads keep
`concurrency` requests in flight; a replayed trace is open loop at its recorded times, with its recorded prompt text
where it has one. Requests go round-robin over the URLs (one per replica). The run stops after
`num_requests` or, for a duration, once no more arrivals fall in it; requests in flight are awaited, and the
measured duration runs from the first measured send to the last completion.

Prompt lengths are calibrated to the server's tokenizer before the clock starts (see prompts.py): on the warm-up
requests, or, with no warm-up, on `CALIBRATION_REQUESTS` one-token requests, so `--warmup-requests 0` never means
uncalibrated lengths. A caller that measured the ratio before passes it (`RunPlan.tokens_per_word`) and sends none.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import httpx
from rich.progress import Progress

from slotune.loadgen.client import send_completion
from slotune.loadgen.prompts import TraceRequest, prompt_for, tokens_per_word
from slotune.loadgen.record import RequestRecord
from slotune.workload import PlannedRequest, PromptText, WorkloadSpec, iter_requests, plan_requests

CALIBRATION_REQUESTS = 2
CALIBRATION_PROMPT_TOKENS = 128  # long enough that the per-prompt marker ("#-1") is noise in the ratio


@dataclass(frozen=True)
class RunPlan:
    urls: tuple[str, ...]
    model: str | None = None  # None: the first id of GET /v1/models
    num_requests: int | None = None
    duration_s: float | None = None
    warmup_requests: int = 4
    max_concurrency: int | None = None
    seed: int = 0
    timeout_s: float = 600.0
    show_progress: bool = True
    tokens_per_word: float | None = None  # the server's, measured earlier; None: measure it before the clock


@dataclass(frozen=True)
class RunResult:
    records: tuple[RequestRecord, ...]
    duration_s: float
    model: str
    tokens_per_word: float  # what the prompts were scaled by


async def served_model(client: httpx.AsyncClient, url: str) -> str:
    response = await client.get(f"{url.rstrip('/')}/v1/models")
    response.raise_for_status()
    return str(response.json()["data"][0]["id"])


class _Sender:
    """Sends requests round-robin over the URLs and keeps their records."""

    def __init__(self, client: httpx.AsyncClient, plan: RunPlan, model: str, progress: Progress | None,
                 tokens_per_word: float = 1.0, prompt_text: PromptText = PromptText.WORDS) -> None:
        self.client, self.plan, self.model, self.progress = client, plan, model, progress
        self.tokens_per_word, self.prompt_text = tokens_per_word, prompt_text
        self.records: list[RequestRecord] = []
        self.started = time.perf_counter()
        self._task = progress.add_task("requests", total=plan.num_requests) if progress else None

    async def send(self, index: int, request: PlannedRequest, warmup: bool = False, prompt: str | None = None,
                   max_tokens: int | None = None) -> None:
        url = self.plan.urls[index % len(self.plan.urls)]
        text = (prompt_for(request, index, self.plan.seed, self.tokens_per_word, self.prompt_text) if prompt is None
                else prompt)
        record = await send_completion(
            self.client, url, self.model, text, max_tokens or request.output_tokens, index,
            time.perf_counter() - self.started, request.prompt_tokens, warmup,
        )
        self.records.append(record)
        if self.progress is not None and self._task is not None and not warmup:
            self.progress.advance(self._task)


async def _open_loop(sender: _Sender, requests: Sequence[TraceRequest], max_concurrency: int | None) -> None:
    slots = asyncio.Semaphore(max_concurrency or len(requests) or 1)

    async def one(index: int, request: TraceRequest) -> None:
        async with slots:
            await sender.send(index, request.planned, prompt=request.prompt)

    tasks = []
    for index, request in enumerate(requests):
        delay_s = request.planned.arrival_s - (time.perf_counter() - sender.started)
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        tasks.append(asyncio.create_task(one(index, request)))
    await asyncio.gather(*tasks)


async def _closed_loop(sender: _Sender, stream: Iterator[PlannedRequest], concurrency: int,
                       num_requests: int | None, duration_s: float | None) -> None:
    counter = itertools.count()

    async def worker() -> None:
        while True:
            index = next(counter)
            elapsed_s = time.perf_counter() - sender.started
            if (num_requests is not None and index >= num_requests) or (duration_s and elapsed_s >= duration_s):
                return
            await sender.send(index, next(stream))

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def trace_window(trace: Sequence[TraceRequest], num_requests: int | None, duration_s: float | None
                 ) -> list[TraceRequest]:
    """The replayed part of a trace: its first `num_requests`, or those arriving within `duration_s`, or all."""
    window = list(trace[:num_requests] if num_requests is not None else trace)
    return [r for r in window if duration_s is None or r.planned.arrival_s <= duration_s]


async def run_workload(spec: WorkloadSpec, plan: RunPlan, trace: Sequence[TraceRequest] | None = None) -> RunResult:
    """Run `spec` (or replay `trace`, which `spec` then only names) against `plan.urls`.

    A trace needs neither `num_requests` nor `duration_s` (both cut it short); a generated workload needs one.
    """
    if trace is None and (plan.num_requests is None) == (plan.duration_s is None):
        raise ValueError("give exactly one of num_requests and duration_s")
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=plan.timeout_s, limits=limits) as client:
        model = plan.model or await served_model(client, plan.urls[0])
        with Progress(disable=not plan.show_progress, transient=True) as progress:
            # Warm-up and calibration send the spec's kind of text: its tokens per word is what they measure.
            ratio = await _warm_up(_Sender(client, plan, model, None, prompt_text=spec.prompt_text), spec, plan, trace)
            ratio = plan.tokens_per_word or ratio or await _calibrate(
                _Sender(client, plan, model, None, prompt_text=spec.prompt_text))
            replayed = None if trace is None else trace_window(trace, plan.num_requests, plan.duration_s)
            sender = _Sender(client, plan if replayed is None else replace(plan, num_requests=len(replayed)), model,
                             progress, ratio, spec.prompt_text)
            if replayed is not None:
                await _open_loop(sender, replayed, plan.max_concurrency)
            elif spec.is_closed_loop:
                stream = iter_requests(spec, plan.seed)
                await _closed_loop(sender, stream, spec.concurrency or 1, plan.num_requests, plan.duration_s)
            else:
                requests = [TraceRequest(r, None) for r in plan_requests(spec, plan.num_requests, plan.duration_s,
                                                                         plan.seed)]
                await _open_loop(sender, requests, plan.max_concurrency or spec.concurrency)
            duration_s = time.perf_counter() - sender.started
    return RunResult(tuple(sorted(sender.records, key=lambda r: r.index)), duration_s, model, ratio)


async def _warm_up(sender: _Sender, spec: WorkloadSpec, plan: RunPlan, trace: Sequence[TraceRequest] | None
                   ) -> float | None:
    """A few requests before the clock starts: first requests after a cold start are several times slower.

    Returns the server's tokens per prompt word, measured on the generated warm-up prompts (None without any).
    A replay warms up with the trace's own first requests (their lengths, not the profile's).
    """
    if plan.warmup_requests <= 0:
        return None
    if trace is not None:
        warmup = list(trace[: plan.warmup_requests])
    else:
        warmup = [TraceRequest(r, None) for r in plan_requests(spec, plan.warmup_requests, seed=plan.seed + 1)]
    await asyncio.gather(*(sender.send(-1 - i, r.planned, warmup=True, prompt=r.prompt)
                           for i, r in enumerate(warmup)))
    planned = {-1 - i: r.planned.prompt_tokens for i, r in enumerate(warmup) if r.prompt is None}
    served = [(planned[r.index], r.prompt_tokens) for r in sender.records if r.ok and r.index in planned]
    return tokens_per_word([p for p, _ in served], [s for _, s in served]) if served else None


async def _calibrate(sender: _Sender) -> float:
    """The server's tokens per prompt word from a few one-token requests (excluded from the results like a
    warm-up): for runs without generated warm-up prompts. 1.0 when the server reports no usage."""
    probe = PlannedRequest(0.0, CALIBRATION_PROMPT_TOKENS, 1, None, 0)
    await asyncio.gather(*(sender.send(-1 - i, probe, warmup=True, max_tokens=1) for i in range(CALIBRATION_REQUESTS)))
    served = [r.prompt_tokens for r in sender.records if r.ok]
    return tokens_per_word([CALIBRATION_PROMPT_TOKENS] * len(served), served)
