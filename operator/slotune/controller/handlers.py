"""kopf handlers of the TunedModel resource; the only module with kopf decorators.

Each handler parses the body into the typed TunedModel on its first line, delegates to slotune.controller.run, and
returns nothing (kopf would otherwise write return values into the status). Children are garbage-collected through
their owner references, so deletion needs no handler. The per-resource daemon drives the tuning loop in its own
thread; a new spec generation starts a new run, the status keeps the loop's state across operator restarts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from slotune.api import GROUP, PLURAL, VERSION, InvalidTunedModel, TunedModel, parse_tunedmodel
from slotune.backends.kube_api import KubeAPI, KubeError
from slotune.backends.kubernetes import OperatorStopping
from slotune.controller.run import TuningRun, deploy
from slotune.settings import OperatorSettings, load_settings

log = logging.getLogger(__name__)
RESOURCE = (GROUP, VERSION, PLURAL)


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
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    memo.settings = load_settings()
    memo.api = KubeAPI.from_environment()
    logging.getLogger("slotune").setLevel(memo.settings.log_level.upper())
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request would drown the operator's log
    settings.posting.level = logging.WARNING  # slotune posts its own events with reasons
    settings.watching.server_timeout = 60
    settings.persistence.finalizer = "slotune.io/finalizer"


@kopf.on.cleanup()
def close(memo: kopf.Memo, **_: Any) -> None:
    memo.api.close()


@kopf.on.create(*RESOURCE)
def created(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    tm = parse(body)
    _deploy(memo, tm, restart_tuning=True)


@kopf.on.update(*RESOURCE, field="spec")
def spec_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    tm = parse(body)
    _deploy(memo, tm, restart_tuning=True)


@kopf.on.resume(*RESOURCE)
def resumed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    tm = parse(body)
    _deploy(memo, tm, restart_tuning=False)


def _deploy(memo: kopf.Memo, tm: TunedModel, restart_tuning: bool) -> None:
    try:
        deploy(memo.api, tm, memo.settings, restart_tuning)
    except KubeError as error:
        raise kopf.TemporaryError(f"applying children failed: {error}", delay=5) from error


@kopf.daemon(*RESOURCE, cancellation_timeout=15.0)
def tune(body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, **_: Any) -> None:
    tm = parse(body)
    settings: OperatorSettings = memo.settings
    run: TuningRun | None = None
    while not stopped:
        tm = parse(body)  # the daemon's body follows the live object
        try:
            if run is None or run.generation != tm.metadata.generation:
                run = TuningRun(memo.api, tm, settings, wait=lambda seconds: bool(stopped.wait(seconds)))
            run.tick()
        except OperatorStopping:
            return
        except (KubeError, OSError) as error:
            log.warning("%s/%s: tick failed, retrying: %s", tm.metadata.namespace, tm.metadata.name, error)
        stopped.wait(settings.tick_s)
