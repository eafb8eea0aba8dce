"""Drives the single-threaded `LLMEngine` from one worker thread and bridges it to asyncio.

The worker loops: apply queued commands (add, abort, calls such as reconfigure) between steps, run one step, hand each
output to its request's asyncio queue (one `call_soon_threadsafe` per step, not per token), record metrics, publish an
`EngineStats` snapshot. Running the step off the event loop keeps first-token waits short (docs/facts.md#cpu).
Admission is bounded: beyond `max_waiting_requests` requests admitted but not yet running, `generate` refuses with 429
and a Retry-After estimated from how fast recent requests finished. A consumer that stops iterating (client gone)
aborts its request, which frees its KV blocks before the next step.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from gpu_runtime.server.metrics import RuntimeMetrics
from gpu_runtime.server.protocol import APIError

if TYPE_CHECKING:
    from gpu_runtime.engine.llm_engine import EngineStats, LLMEngine, RequestOutput, SamplingParams

log = logging.getLogger(__name__)
T = TypeVar("T")
_MAX_RETRY_AFTER_S = 60
_E2E_EWMA_WEIGHT = 0.1  # weight of the newest finished request in the service-time average


class EngineDeadError(APIError):
    """The worker's step raised; the engine serves nothing more (a 500 for the requests it held)."""

    def __init__(self, message: str) -> None:
        super().__init__(500, message, type_="server_error", code="engine_dead")


@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    stream: RequestStream
    accepted: Future[None]
    # Taken when the HTTP handler submits, not when the worker thread gets to it between steps: TTFT and queue time
    # must include the wait for the current step, as the client sees it.
    arrival_time: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _Call:
    fn: Callable[[LLMEngine], object]
    done: Future[object]


class AsyncEngine:
    """The asyncio face of one LLMEngine; create it inside the running event loop, then `start()`."""

    def __init__(self, engine: LLMEngine, metrics: RuntimeMetrics, max_waiting_requests: int,
                 on_reconfigured: Callable[[LLMEngine], None] = lambda _: None) -> None:
        self.engine = engine
        self.metrics = metrics
        self.max_waiting_requests = max_waiting_requests
        self._on_reconfigured = on_reconfigured
        self._loop: asyncio.AbstractEventLoop | None = None
        self._commands: deque[_Add | _Abort | _Call] = deque()
        self._wakeup = threading.Event()
        self._stopping = False
        self._streams: dict[str, RequestStream] = {}  # worker thread only
        self._num_in_flight = 0  # event loop only: admitted and not yet released
        self._e2e_ewma_s = 1.0
        self.stats: EngineStats = engine.stats()
        self.dead = False
        self._thread = threading.Thread(target=self._run, name="engine-worker", daemon=True)

    def start(self) -> None:
        """Start the worker; call from inside the event loop that will consume the outputs."""
        self._loop = asyncio.get_running_loop()
        self.metrics.record_step(self.stats, stepped=False)
        self._thread.start()

    def shutdown(self) -> None:
        self._stopping = True
        self._wakeup.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return not self.dead and self._thread.is_alive()

    # ---- event loop side -------------------------------------------------------------------------------------------

    async def submit(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> RequestStream:
        """Admit and add one request; raises APIError 429 when the queue is full, 400 when the engine refuses it."""
        self._admit()
        stream = RequestStream(self, request_id)
        self._num_in_flight += 1
        accepted: Future[None] = Future()
        self._submit(_Add(request_id, prompt_token_ids, params, stream, accepted))
        try:
            await asyncio.wrap_future(accepted)
        except ValueError as error:  # the engine refused the request (empty prompt, beyond the context, ...)
            stream.release(None)
            raise APIError(400, str(error)) from error
        except BaseException:  # cancelled while waiting (client gone): the abort follows the add in command order
            await stream.aclose()
            raise
        return stream

    async def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run fn(engine) on the worker between two steps (reconfigure, set_speculative, ...) and return its result."""
        done: Future[object] = Future()
        self._submit(_Call(fn, done))
        return await asyncio.wrap_future(done)  # type: ignore[return-value]

    def _admit(self) -> None:
        if self.dead:
            raise APIError(503, "engine is dead", type_="server_error")
        num_waiting = self._num_in_flight - self.stats.num_running
        if num_waiting >= self.max_waiting_requests:
            raise APIError(429, f"server overloaded: {num_waiting} requests waiting (limit "
                                f"{self.max_waiting_requests}); retry later", type_="rate_limit_error",
                           code="overloaded", retry_after_s=self._retry_after_s(num_waiting))

    def _retry_after_s(self, num_waiting: int) -> int:
        # Little's law: the queue drains at about num_running / mean service time requests per second.
        drain_per_s = max(1, self.stats.num_running) / max(self._e2e_ewma_s, 1e-3)
        return max(1, min(_MAX_RETRY_AFTER_S, math.ceil(num_waiting / drain_per_s)))

    def release(self, finished: RequestOutput | None) -> None:
        """A request left the system (finished, failed or aborted): free its admission slot."""
        self._num_in_flight -= 1
        if finished is not None and finished.times.last_token is not None:
            e2e_s = finished.times.last_token - finished.times.arrival
            self._e2e_ewma_s += _E2E_EWMA_WEIGHT * (e2e_s - self._e2e_ewma_s)

    def abort(self, request_id: str) -> None:
        self._submit(_Abort(request_id))

    def _submit(self, command: _Add | _Abort | _Call) -> None:
        self._commands.append(command)
        self._wakeup.set()

    # ---- worker thread side ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._wakeup.clear()  # before draining: a command queued after this line wakes the wait below
                self._apply_commands()
                if self.engine.has_unfinished_requests():
                    self._step()
                else:
                    self._publish(stepped=False)
                    self._wakeup.wait()
        except Exception as error:  # a step that raises leaves the engine in an unknown state: stop serving
            log.exception("engine worker died")
            self._die(error)

    def _apply_commands(self) -> None:
        applied = False
        while self._commands:
            command = self._commands.popleft()
            applied = True
            if isinstance(command, _Add):
                self._add(command)
            elif isinstance(command, _Abort):
                self._abort(command.request_id)
            else:
                self._call(command)
        if applied:
            self._publish(stepped=False)

    def _add(self, command: _Add) -> None:
        try:
            self.engine.add_request(command.request_id, command.prompt_token_ids, command.params,
                                    arrival_time=command.arrival_time)
        except ValueError as error:
            command.accepted.set_exception(error)
            return
        self._streams[command.request_id] = command.stream
        command.accepted.set_result(None)

    def _abort(self, request_id: str) -> None:
        if self._streams.pop(request_id, None) is not None:
            self.engine.abort_request(request_id)  # the next step reports it finished with reason "abort"

    def _call(self, command: _Call) -> None:
        try:
            command.done.set_result(command.fn(self.engine))
        except Exception as error:  # handed to the awaiting coroutine, which decides the status
            command.done.set_exception(error)
        self._on_reconfigured(self.engine)

    def _step(self) -> None:
        outputs = self.engine.step()
        deliveries: list[tuple[RequestStream, RequestOutput | Exception]] = []
        for output in outputs:
            self.metrics.record_output(output)
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            if output.finished:
                del self._streams[output.request_id]
            deliveries.append((stream, output))
        self._publish(stepped=True)
        if deliveries:
            self._post(deliveries)

    def _publish(self, stepped: bool) -> None:
        self.stats = self.engine.stats()
        self.metrics.record_step(self.stats, stepped)

    def _post(self, deliveries: list[tuple[RequestStream, RequestOutput | Exception]]) -> None:
        assert self._loop is not None  # start() sets it before the worker runs
        self._loop.call_soon_threadsafe(_deliver, deliveries)

    def _die(self, error: Exception) -> None:
        self.dead = True
        dead = EngineDeadError(f"engine worker died: {error}")
        deliveries: list[tuple[RequestStream, RequestOutput | Exception]] = [
            (stream, dead) for stream in self._streams.values()]
        self._streams.clear()
        for command in self._commands:
            if isinstance(command, _Add):
                command.accepted.set_exception(dead)
            elif isinstance(command, _Call):
                command.done.set_exception(dead)
        self._post(deliveries)


def _deliver(deliveries: list[tuple[RequestStream, RequestOutput | Exception]]) -> None:
    for stream, item in deliveries:
        stream.put(item)


class RequestStream:
    """The outputs of one admitted request, in order, until it finishes; `aclose()` early aborts it.

    The in-flight count is released exactly once: when the finished output (or an engine failure) arrives, or on an
    early close, whichever comes first, so a consumer that never starts iterating still frees its admission slot
    when its request ends.
    """

    def __init__(self, engine: AsyncEngine, request_id: str) -> None:
        self.request_id = request_id
        self._engine = engine
        self._queue: asyncio.Queue[RequestOutput | Exception] = asyncio.Queue()
        self._released = False
        self._done = False
        self._failure: Exception | None = None  # seen while draining; raised on the next read

    def put(self, item: RequestOutput | Exception) -> None:
        if isinstance(item, Exception):
            self.release(None)
        elif item.finished:
            self.release(item)
        self._queue.put_nowait(item)

    def release(self, finished: RequestOutput | None) -> None:
        if not self._released:
            self._released = True
            self._engine.release(finished)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._failure is not None:
            failure, self._failure, self._done = self._failure, None, True
            raise failure
        if self._done:
            raise StopAsyncIteration
        return self._accept(await self._queue.get())

    async def next_batch(self) -> list[RequestOutput]:
        """Every output ready now (at least one): a consumer that fell behind catches up in one write, not many."""
        batch = [await self.__anext__()]
        while not self._done and not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, Exception):  # raised by the next read, after this batch went out
                self._failure = item
                break
            batch.append(self._accept(item))
        return batch

    def _accept(self, item: RequestOutput | Exception) -> RequestOutput:
        if isinstance(item, Exception):
            self._done = True
            raise item
        self._done = item.finished
        return item

    @property
    def done(self) -> bool:
        return self._done and self._failure is None

    async def aclose(self) -> None:
        if not self._released:  # neither finished nor failed: the engine still holds it
            self.release(None)
            self._engine.abort(self.request_id)
        self._done = True
