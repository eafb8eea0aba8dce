"""Load for the end-to-end tests: requests to whatever runtime processes serve right now, until stopped.

Every request picks its URL when it is sent, round-robin over the list `urls()` returns at that moment (the kubelet
stand-in's registered pods), so a pod added by a scale-up gets its share from its first ready moment and a pod that
went away gets nothing more; nothing is cut off at the end of a run, since there are no runs. Requests go through
slotune.loadgen's client (streamed completions, `ignore_eos`, so outputs are exactly as long as planned), with lengths
drawn from a WorkloadSpec as `slotune loadgen` draws them.

Two shapes, switched while running (`load.shape = ...`):
- closed loop: `Shape(clients=N)` keeps N requests in flight (a client sends its next request when one returns);
- bursts: `Shape(clients=N, every_s=P)` sends N requests at once every P seconds, open loop (never waiting for the
  previous burst). N simultaneous arrivals need N free sequence slots among the replicas they reach, so whether they
  queue is decided by counting slots, not by how fast the cores are; and the request rate is N / P on any machine
  that finishes a burst within P.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

from slotune.loadgen.client import send_completion
from slotune.loadgen.prompts import prompt_for, tokens_per_word, words
from slotune.loadgen.record import RequestRecord
from slotune.loadgen.runner import CALIBRATION_PROMPT_TOKENS
from slotune.workload import PlannedRequest, WorkloadSpec, iter_requests

TICK_S = 0.05  # how often the closed loop's client count and the burst schedule are looked at


@dataclass(frozen=True)
class Shape:
    """`clients` requests in flight (closed loop), or, with `every_s`, a burst of `clients` every `every_s` s."""

    clients: int
    every_s: float | None = None

    def describe(self) -> str:
        if self.every_s is None:
            return f"closed loop of {self.clients}"
        return f"bursts of {self.clients} every {self.every_s:g} s ({self.clients / self.every_s:.2f}/s)"


@dataclass
class Tally:
    """What was sent and how it went, kept for the test's assertions and its failure messages."""

    sent: int = 0
    ok: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    recent: list[RequestRecord] = field(default_factory=list)  # the latest ones, for describe()

    def add(self, record: RequestRecord) -> None:
        if record.error is None:
            self.ok += 1
        else:
            self.failed += 1
            self.errors = [*self.errors, record.error][-10:]
        self.recent = [*self.recent, record][-200:]


class Load:
    def __init__(self, urls: Callable[[], Sequence[str]], workload: WorkloadSpec, shape: Shape,
                 model: str = "tiny", timeout_s: float = 120.0) -> None:
        self.urls, self.model, self.timeout_s = urls, model, timeout_s
        self.shape = shape  # read on every tick: assign to change the load while it runs
        self.tally = Tally()
        self._requests = iter_requests(workload, seed=0)
        self._index = itertools.count()
        self._tokens_per_word = 1.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="load", daemon=True)

    @property
    def requests_sent(self) -> int:
        return self.tally.sent

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def describe(self) -> str:
        ttfts = [f"{r.ttft_s * 1000:.0f}" for r in self.tally.recent[-20:] if r.ttft_s is not None]
        return (f"load: {self.shape.describe()}; sent {self.tally.sent}, ok {self.tally.ok}, failed "
                f"{self.tally.failed} {self.tally.errors[-3:]}; latest client TTFTs (ms): {' '.join(ttfts)}")

    def bursts(self, count: int) -> list[RequestRecord]:
        """Instead of starting: `count` bursts of `shape.clients` requests, each sent once the previous one finished
        (a calibration: the runtime's step time and first-token time when a burst fits its slots)."""

        async def run() -> list[RequestRecord]:
            async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                await self._calibrate(client)
                for _ in range(count):
                    await asyncio.gather(*(self._send(client) for _ in range(self.shape.clients)))
            return self.tally.recent[-count * self.shape.clients:]

        return asyncio.run(run())

    # -- the event loop's side ------------------------------------------------------------------------------------

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=self.timeout_s, limits=limits) as client:
            await self._calibrate(client)
            in_flight: set[asyncio.Task] = set()
            clients: list[asyncio.Task] = []
            next_burst_s = time.monotonic()
            while not self._stop.is_set():
                shape = self.shape
                if shape.every_s is None:
                    clients = [c for c in clients if not c.done()]
                    while len(clients) < shape.clients:
                        clients.append(asyncio.create_task(self._client(client, len(clients))))
                else:
                    now = time.monotonic()
                    if now >= next_burst_s:
                        for _ in range(shape.clients):
                            task = asyncio.create_task(self._send(client))
                            in_flight.add(task)
                            task.add_done_callback(in_flight.discard)
                        # Open loop; a burst the generator itself was too late for is dropped, not doubled up.
                        next_burst_s = max(next_burst_s + shape.every_s, now)
                await asyncio.sleep(TICK_S)
            for task in (*clients, *in_flight):
                task.cancel()
            await asyncio.gather(*clients, *in_flight, return_exceptions=True)

    async def _client(self, client: httpx.AsyncClient, slot: int) -> None:
        """One closed-loop client: sends while the shape still counts it (a lower count retires it after its
        request returns)."""
        while not self._stop.is_set() and self.shape.every_s is None and slot < self.shape.clients:
            if not await self._send(client):
                await asyncio.sleep(0.5)  # no runtime serves yet, or one went away: look again shortly

    async def _send(self, client: httpx.AsyncClient) -> bool:
        urls = list(self.urls())
        if not urls:
            return False
        index = next(self._index)
        request = next(self._requests)
        self.tally.sent += 1
        record = await send_completion(client, urls[index % len(urls)], self.model,
                                       prompt_for(request, index, tokens_per_word=self._tokens_per_word),
                                       request.output_tokens, index, time.monotonic(), request.prompt_tokens)
        self.tally.add(record)
        return record.error is None

    async def _calibrate(self, client: httpx.AsyncClient) -> None:
        """The server's tokens per prompt word, once, from a one-token request (as slotune loadgen does), so the
        planned prompt lengths hold on the tiny model's tokenizer."""
        while not self._stop.is_set():
            urls = list(self.urls())
            if urls:
                probe = PlannedRequest(0.0, CALIBRATION_PROMPT_TOKENS, 1, None, 0)
                record = await send_completion(client, urls[0], self.model, words(CALIBRATION_PROMPT_TOKENS, seed=0),
                                               1, -1, 0.0, probe.prompt_tokens, warmup=True)
                if record.error is None:
                    self._tokens_per_word = tokens_per_word([CALIBRATION_PROMPT_TOKENS], [record.prompt_tokens])
                    return
            await asyncio.sleep(0.5)
