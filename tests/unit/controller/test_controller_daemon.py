"""The per-TunedModel daemon survives a fault in its tick and stops at once.

The fault is real: the daemon's API client points at a port where nothing listens, so every request fails with
httpx's ConnectError, as during an API-server outage. kopf's stop flag is built from kopf's own classes (the
daemon receives one of these from kopf), because only kopf can otherwise set it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import kopf
import pytest
import yaml
from kopf._cogs.aiokits import aioenums
from kubernetes import client

from slotune.backends.kube_api import Credentials, KubeAPI
from slotune.controller import handlers
from slotune.controller.handlers import tune
from slotune.controller.windows import SharedWindows
from slotune.settings import OperatorSettings
from tests.harness.ports import free_port
from tests.unit.api_cases import BASE


def _memo(tick_s: float) -> kopf.Memo:
    memo = kopf.Memo()
    memo.settings = OperatorSettings(tick_s=tick_s, prometheus_url="")
    host = f"http://127.0.0.1:{free_port()}"  # nothing listens: connection refused on every request
    memo.api = KubeAPI(Credentials(host, False, client.Configuration(host=host)), timeout_s=1.0)
    memo.pool = ThreadPoolExecutor(max_workers=2)
    memo.windows = SharedWindows()
    return memo


def _body() -> kopf.Body:
    manifest = yaml.safe_load(BASE.read_text())
    manifest["metadata"] |= {"namespace": "default", "generation": 1, "uid": "u-1"}
    return kopf.Body(manifest)


def test_a_tick_that_raises_is_logged_backed_off_and_retried_and_stop_is_immediate(caplog) -> None:
    memo = _memo(tick_s=0.01)
    setter: aioenums.FlagSetter = aioenums.FlagSetter()
    stopped = aioenums.AsyncFlagWaiter(setter)
    caplog.set_level(logging.WARNING, logger="slotune.controller.handlers")

    def failures() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "tick failed" in r.getMessage()]

    async def scenario() -> float:
        daemon = asyncio.create_task(tune(body=_body(), memo=memo, stopped=stopped))
        while len(failures()) < 4:  # progress, not time: four faults in a row, each survived
            assert not daemon.done(), daemon.exception() if daemon.done() else None
            await asyncio.sleep(0.01)
        setter.set(kopf.DaemonStoppingReason.RESOURCE_DELETED)
        started = time.monotonic()
        await asyncio.wait_for(daemon, timeout=30)
        return time.monotonic() - started

    try:
        stop_s = asyncio.run(scenario())
    finally:
        memo.pool.shutdown(wait=True)
        memo.api.close()
    lines = [r.getMessage() for r in failures()]
    assert all("ConnectError" in line for line in lines), lines
    delays = [float(line.split("retry in ")[1].split(" s")[0]) for line in lines]
    assert delays == sorted(delays) and delays[-1] > delays[0]  # backing off, never giving up
    assert stop_s < 1.0  # the daemon sleeps on the stop flag, not in a thread


@pytest.mark.parametrize("tick_s", [0.01])
def test_an_invalid_spec_does_not_kill_the_daemon(caplog, tick_s: float) -> None:
    memo = _memo(tick_s)
    setter: aioenums.FlagSetter = aioenums.FlagSetter()
    stopped = aioenums.AsyncFlagWaiter(setter)
    body = _body()
    body_raw = dict(body)
    body_raw["spec"] = {"model": {"name": "m"}}  # what a stale object written before a CRD change could hold
    caplog.set_level(logging.WARNING, logger="slotune.controller.handlers")

    async def scenario() -> None:
        daemon = asyncio.create_task(tune(body=kopf.Body(body_raw), memo=memo, stopped=stopped))
        while not any("is invalid" in r.getMessage() for r in caplog.records):
            assert not daemon.done()
            await asyncio.sleep(0.01)
        setter.set(kopf.DaemonStoppingReason.RESOURCE_DELETED)
        await asyncio.wait_for(daemon, timeout=30)

    try:
        asyncio.run(scenario())
    finally:
        memo.pool.shutdown(wait=True)
        memo.api.close()


def test_a_new_daemon_ticks_only_after_its_own_create_handler_however_long_it_queues(caplog, monkeypatch) -> None:
    """The create handler is the one owner of the first apply of the children: a daemon whose handler still queues
    for the API server (a burst of 1,000 creates: up to 500 s) must not step, since its first step would apply them
    too. It gave up after FIRST_TICK_PATIENCE_S (60 s) and applied them: 1.44 applies per create at 1,000."""
    monkeypatch.setattr(handlers, "FIRST_TICK_PATIENCE_S", 0.2)
    monkeypatch.setattr(handlers, "HANDLER_START_S", 0.2)
    memo = _memo(tick_s=0.01)
    memo.deploys_queued = handlers.Queued()
    memo.handled = handlers.Handled()
    body = _body()
    memo.deploys_queued.count += 1  # its create handler started, and waits for a deploy worker
    memo.handled.start(body.metadata.uid)
    setter: aioenums.FlagSetter = aioenums.FlagSetter()
    stopped = aioenums.AsyncFlagWaiter(setter)
    caplog.set_level(logging.WARNING, logger="slotune.controller.handlers")

    def ticks() -> int:  # every step fails here (nothing listens), and says so
        return sum("tick failed" in r.getMessage() for r in caplog.records)

    async def scenario() -> int:
        daemon = asyncio.create_task(tune(body=body, memo=memo, stopped=stopped))
        await asyncio.sleep(10 * 0.2)  # ten times both waits' caps: the old daemon had stepped by now
        before = ticks()
        memo.deploys_queued.count -= 1
        memo.handled.finish(body.metadata.uid)
        while ticks() == 0:  # progress: the first step follows the handler
            assert not daemon.done()
            await asyncio.sleep(0.01)
        setter.set(kopf.DaemonStoppingReason.RESOURCE_DELETED)
        await asyncio.wait_for(daemon, timeout=30)
        return before

    try:
        assert asyncio.run(scenario()) == 0
    finally:
        memo.pool.shutdown(wait=True)
        memo.api.close()
    assert body.metadata.uid not in memo.handled.done  # a deleted TunedModel is forgotten


def test_a_daemon_waiting_for_a_busy_worker_exits_within_kopfs_instant_exit() -> None:
    """kopf gives a stopped daemon 10 zero-time cycles (or instant_exit_timeout) before it cancels it, and on a
    delete a daemon that outlives that costs its finalizer another round (at 1,000 TunedModels ticks wait seconds for
    a worker). Waiting for a worker, the daemon must see the stop flag at once."""
    memo = _memo(tick_s=0.01)
    memo.pool.shutdown(wait=True)
    memo.pool = ThreadPoolExecutor(max_workers=1)
    busy = threading.Event()
    memo.pool.submit(busy.wait, 30)  # every worker busy: the daemon's first call queues behind it
    setter: aioenums.FlagSetter = aioenums.FlagSetter()
    stopped = aioenums.AsyncFlagWaiter(setter)

    async def scenario() -> int:
        daemon = asyncio.create_task(tune(body=_body(), memo=memo, stopped=stopped))
        deadline = time.monotonic() + 30
        while memo.pool._work_queue.qsize() == 0:  # progress: the daemon's call is queued for the worker
            assert time.monotonic() < deadline and not daemon.done()
            await asyncio.sleep(0.01)
        setter.set(kopf.DaemonStoppingReason.RESOURCE_DELETED)
        for cycle in range(10):  # kopf's instant exit: ten zero-time cycles
            if daemon.done():
                return cycle
            await asyncio.sleep(0)
        daemon.cancel()
        return 10

    try:
        cycles = asyncio.run(scenario())
    finally:
        busy.set()
        memo.pool.shutdown(wait=True)
        memo.api.close()
    assert cycles < 10
