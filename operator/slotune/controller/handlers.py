"""kopf handlers of the TunedModel resource; the only module with kopf decorators.

Each handler parses the body into the typed TunedModel on its first line, delegates to slotune.controller.run, and
returns nothing (kopf would otherwise write return values into the status). Children are garbage-collected through
their owner references, so deletion needs no handler.

Every handler is async and holds no thread: the blocking work (API requests, PromQL queries) of all TunedModels runs
on bounded pools, a short call at a time: the create/update/resume handlers on their own (`DEPLOY_WORKERS` threads),
so a new TunedModel's children never queue behind a thousand ticks, and the ticks on `settings.workers` threads.
The per-resource daemon sleeps on the event loop until its next tick has work (a window's end, a rollout to look
at), so a thousand TunedModels cost a thousand sleeping coroutines, not a thousand threads, and deletion or SIGTERM
stops them at once. A tick that raises is reported on the resource and retried with backoff; the status keeps the
loop's state across operator restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import kopf

from slotune.api import GROUP, PLURAL, VERSION, InvalidTunedModel, TunedModel, parse_tunedmodel
from slotune.backends.kube_api import KubeAPI
from slotune.backends.kube_cache import ChildCache
from slotune.backends.kube_deployment import ChildRefused
from slotune.controller import heap, telemetry
from slotune.controller.events import EventRecorder
from slotune.controller.run import TuningRun, deploy
from slotune.controller.windows import SharedWindows
from slotune.settings import OperatorSettings, load_settings

log = logging.getLogger(__name__)
RESOURCE = (GROUP, VERSION, PLURAL)
MAX_BACKOFF_S = 60.0
DEPLOY_WORKERS = 8
FIRST_TICK_PATIENCE_S = 60.0  # a new daemon's first tick waits at most this long for other TunedModels' children
HANDLER_START_S = 30.0  # how long a new daemon waits for its own create/resume handler to start at all
WINDOW_PATIENCE_S = 0.1  # a tick waits this long for its window's read in flight, then frees its worker
# A tick whose window has ended waits on the event loop for the window's shared read, at most this long (a read's
# queries have their own timeouts; then the tick meets the read in flight and is told when to come back).
READ_WAIT_S = 60.0
CLOSE_WAIT_S = 3.0  # on shutdown, how long the workers' calls in flight may finish before the operator exits
T = TypeVar("T")


class Queued:
    """Create/update/resume handlers waiting for or holding a deploy worker. An object, not a number: each resource's
    memo is a shallow copy of the operator's, so only a shared object is seen by every handler (changed on the
    event loop's thread only: no lock)."""

    def __init__(self) -> None:
        self.count = 0


class Handled:
    """Which TunedModels (by uid) have a create/update/resume handler running, and which had one finish, in this
    process: a daemon's first tick waits for its own TunedModel's handler, the one owner of the first apply of its
    children. Shared and changed on the event loop's thread only, like Queued."""

    def __init__(self) -> None:
        self.running: dict[str, int] = {}
        self.done: set[str] = set()

    def start(self, uid: str) -> None:
        self.running[uid] = self.running.get(uid, 0) + 1

    def finish(self, uid: str) -> None:
        self.running[uid] -= 1
        if not self.running[uid]:
            del self.running[uid]
        self.done.add(uid)

    def forget(self, uid: str) -> None:
        self.done.discard(uid)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def parse(body: Mapping[str, Any]) -> TunedModel:
    """The typed TunedModel of a kopf body (status left out: the operator never reads its own output as input)."""
    try:
        return parse_tunedmodel({k: _plain(v) for k, v in body.items() if k != "status"})
    except InvalidTunedModel as error:
        raise kopf.PermanentError(str(error)) from error


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    memo.settings = load_settings()
    memo.api = KubeAPI.from_environment(max_connections=memo.settings.workers + DEPLOY_WORKERS)
    # Ticks read their Deployment and Secret from watches (until the first lists answer, from the API server).
    memo.api.children = ChildCache(memo.api.credentials, memo.settings.watch_namespaces).start()
    memo.pool = ThreadPoolExecutor(max_workers=memo.settings.workers, thread_name_prefix="slotune-tick")
    memo.deploys = ThreadPoolExecutor(max_workers=DEPLOY_WORKERS, thread_name_prefix="slotune-deploy")
    memo.deploys_queued = Queued()
    memo.handled = Handled()
    memo.windows = SharedWindows(patience_s=WINDOW_PATIENCE_S, retry_s=memo.settings.tick_s)
    telemetry.serve(memo.settings.metrics_port)
    memo.loop_lag = asyncio.create_task(_watch_loop_lag())
    memo.heap = asyncio.create_task(heap.keep_old_objects_frozen())  # full GCs scan only young objects (heap.py)
    logging.getLogger("slotune").setLevel(memo.settings.log_level.upper())
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request would drown the operator's log
    settings.posting.level = logging.WARNING  # slotune posts its own events with reasons
    settings.watching.server_timeout = 60
    settings.persistence.finalizer = "slotune.io/finalizer"
    # Serving named namespaces, kopf would list and watch every Namespace and CRD to notice new ones: cluster-scoped
    # reads the chart's namespaced Roles do not grant (least privilege, docs/security.md). The CRD is installed first.
    settings.scanning.disabled = bool(memo.settings.watch_namespaces)
    # A deleted TunedModel's daemon exits once cancelled (it awaits only the stop flag and its worker's future), but on
    # a busy event loop maybe not within kopf's 10 zero-time cycles: kopf then sleeps, PATCHes a dummy annotation and
    # waits for its watch event before it removes the finalizer, a round trip through a busy API server per delete.
    settings.background.instant_exit_timeout = 1.0


async def _watch_loop_lag(period_s: float = 0.5) -> None:
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await asyncio.sleep(period_s)
        telemetry.EVENT_LOOP_LAG.observe(max(0.0, loop.time() - started - period_s))


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    memo.loop_lag.cancel()
    memo.heap.cancel()
    memo.windows.close()
    if memo.api.children is not None:
        memo.api.children.stop()  # each watch thread closes its own connection
    # The API client is closed only once no worker uses it: a connection closed under a request in flight frees its
    # socket's descriptor while that worker still reads it (kube_cache.py says what that does). Workers run short
    # calls; one stuck past CLOSE_WAIT_S leaves the client to the process's exit.
    drained = asyncio.gather(*(asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)
                               for pool in (memo.pool, memo.deploys)))
    started = time.monotonic()
    try:
        await asyncio.wait_for(drained, CLOSE_WAIT_S)
    except TimeoutError:
        log.warning("workers still busy %.0f s after shutdown began; the API client is left to the exit", CLOSE_WAIT_S)
        return
    memo.api.close()
    log.info("cleanup: the workers drained in %.2f s", time.monotonic() - started)


async def blocking(memo: kopf.Memo, call: Callable[..., T], *args: Any) -> T:
    """Run one short blocking call (HTTP requests, no sleeps) on the ticks' bounded pool."""
    return await asyncio.get_running_loop().run_in_executor(memo.pool, call, *args)


class Stopped(Exception):
    """The daemon was stopped while it waited for a worker."""


async def unless_stopped(stopped: kopf.DaemonStopped, work: Awaitable[T]) -> T:
    """`work`, unless the daemon is stopped first (then Stopped; a call already running goes on, its result
    dropped). At 1,000 TunedModels a tick waits seconds for one of the workers: a deleted TunedModel's daemon stuck
    there outlived kopf's instant-exit wait, was cancelled after it, and its finalizer went a second later."""
    job = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(_stop_flag(stopped))
    try:
        await asyncio.wait((job, stop), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if not job.done():
        job.cancel()
        raise Stopped
    return job.result()


async def _answered(future: Future[Any], timeout_s: float) -> None:
    """Until `future` (a window's shared read, on a reader thread) is done, at most `timeout_s`. The read is shared
    by many TunedModels: this waits for it without ever cancelling it."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not done.done():
            done.set_result(None)

    def on_done(_: Future[Any]) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop closed first: nobody waits any more
            loop.call_soon_threadsafe(wake)

    future.add_done_callback(on_done)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done, timeout_s)


async def _stop_flag(stopped: kopf.DaemonStopped) -> None:
    await stopped.wait()


async def deploying(memo: kopf.Memo, call: Callable[..., T], *args: Any) -> T:
    """The same, on the handlers' own pool."""
    return await asyncio.get_running_loop().run_in_executor(memo.deploys, call, *args)


@kopf.on.create(*RESOURCE)
async def created(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await _deploy(memo, body, parse(body), restart_tuning=True)


@kopf.on.update(*RESOURCE, field="spec")
async def spec_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await _deploy(memo, body, parse(body), restart_tuning=True)


@kopf.on.resume(*RESOURCE)
async def resumed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await _deploy(memo, body, parse(body), restart_tuning=False)


async def _deploy(memo: kopf.Memo, body: kopf.Body, tm: TunedModel, restart_tuning: bool) -> None:
    memo.deploys_queued.count += 1
    memo.handled.start(body.metadata.uid)
    try:
        await deploying(memo, deploy, memo.api, tm, memo.settings, restart_tuning)
    except ChildRefused as error:
        # Retrying cannot help; the daemon's first step meets the same refusal and sets Degraded with it.
        await deploying(memo, EventRecorder(memo.api, tm), error.reason, str(error), True)
        raise kopf.PermanentError(str(error)) from error
    except Exception as error:
        raise kopf.TemporaryError(f"applying children failed: {type(error).__name__}: {error}", delay=5) from error
    finally:
        memo.deploys_queued.count -= 1
        memo.handled.finish(body.metadata.uid)  # failed too: the daemon's step then meets the fault and reports it


async def _children_first(memo: kopf.Memo, uid: str, stopped: kopf.DaemonStopped) -> None:
    """A new daemon's first tick (a full step: the children read, a status written, events posted) waits for its
    own TunedModel's create/resume handler to finish, however long that handler queues for the API server: the
    handler applies the children, and a first step before it applied them too (1.44 applies per create in a burst
    of 1,000, when this wait was capped at 60 s). A handler that has not even started after HANDLER_START_S (none
    will run in this process) is not waited for. Then it waits while other create handlers queue, at most
    FIRST_TICK_PATIENCE_S: in a storm of creates the API server's time goes to new TunedModels' children first,
    and their first ticks follow."""
    handled: Handled | None = getattr(memo, "handled", None)
    waited = 0.0
    while (handled is not None and uid not in handled.done and (uid in handled.running or waited < HANDLER_START_S)
           and not stopped):
        await stopped.wait(0.5)
        waited += 0.5
    waited = 0.0
    queued = getattr(memo, "deploys_queued", None)
    while queued is not None and queued.count > 0 and waited < FIRST_TICK_PATIENCE_S and not stopped:
        await stopped.wait(0.5)
        waited += 0.5


# initial_delay: a new TunedModel's create handler deploys its children first; the daemon's first step then finds
# them instead of applying them a second time. cancellation_timeout: a daemon waiting for a worker is cancelled at
# once on delete (the tick it waited for still runs, and its result is dropped).
@kopf.daemon(*RESOURCE, initial_delay=1.0, cancellation_timeout=0.1)
async def tune(body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, **_: Any) -> None:
    settings: OperatorSettings = memo.settings
    run: TuningRun | None = None
    failures = 0
    scheduled: float | None = None  # when this tick was due (monotonic); None: the first one
    telemetry.DAEMONS.inc()
    try:
        await _children_first(memo, body.metadata.uid, stopped)
        while not stopped:
            delay = settings.tick_s
            try:
                run = await _current_run(body, memo, stopped, run)
                delay = await _step(memo, stopped, run, scheduled)
                failures = 0
            except Stopped:
                break
            except kopf.PermanentError as error:  # an invalid spec: nothing to tune until it is edited
                log.warning("%s/%s: %s", body.metadata.namespace, body.metadata.name, error)
            except Exception as error:  # a fault is a value: report it, keep the saved state, back off, retry
                failures += 1
                telemetry.TICK_FAILURES.inc()
                delay = min(settings.tick_s * 2**failures, MAX_BACKOFF_S)
                log.warning("%s/%s: tick failed (retry in %.3g s): %s: %s", body.metadata.namespace,
                            body.metadata.name, delay, type(error).__name__, error)
                if run is not None:
                    await _report(memo, run, error)
            scheduled = time.monotonic() + delay
            await stopped.wait(delay)
    finally:
        telemetry.DAEMONS.dec()
        if stopped and (handled := getattr(memo, "handled", None)) is not None:
            handled.forget(body.metadata.uid)


async def _current_run(body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped,
                       run: TuningRun | None) -> TuningRun:
    """The run for the live object's generation. The daemon's body follows the live object; it is parsed (on the
    event loop) only for a new generation: a thousand TunedModels' ticks parsed every spec again ~50 times a
    second."""
    if run is not None and run.generation == (body.get("metadata") or {}).get("generation"):
        return run
    tm = parse(body)
    status = _plain(body.get("status") or {})  # as kopf's watch holds it: the run's first reads cost no GET
    return await unless_stopped(stopped, blocking(memo, TuningRun, memo.api, tm, memo.settings, memo.windows,
                                                  time.time, status))


async def _step(memo: kopf.Memo, stopped: kopf.DaemonStopped, run: TuningRun, scheduled: float | None) -> float:
    """One tick of `run`, its readings awaited here rather than on a worker; the delay to the next tick."""
    if (pending := run.pending_read()) is not None:
        await unless_stopped(stopped, _answered(pending, READ_WAIT_S))
        scheduled = time.monotonic()  # due once its readings are in: the lag is the wait for a worker
    return await unless_stopped(stopped, blocking(memo, _tick, run, scheduled))


def _tick(run: TuningRun, scheduled: float | None) -> float:
    """On a worker: the lag is measured here, where the tick really starts (after waiting for a free worker)."""
    started = time.monotonic()
    if scheduled is not None:
        telemetry.TICK_LAG.observe(max(0.0, started - scheduled))
    try:
        return run.tick()
    finally:
        telemetry.TICK_DURATION.observe(time.monotonic() - started)


async def _report(memo: kopf.Memo, run: TuningRun, error: Exception) -> None:
    try:
        await blocking(memo, run.report_fault, error)
    except Exception as failed:  # the API server may be the fault: the log line above is all there is
        log.warning("could not report the fault: %s: %s", type(failed).__name__, failed)
