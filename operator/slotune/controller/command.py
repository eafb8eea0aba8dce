"""`slotune operator`: run the kopf operator in-process (liveness endpoint, peering, namespaces from settings).

The liveness endpoint carries a `serving` probe: whether the TunedModel CRD is installed, TunedModels can be listed
and the peering object exists. Missing any, the process is alive but serves nothing; a restart would not help, so the
probe answers (200) with the reasons instead of failing, and the log says the same.

Every flag mirrors an environment variable of the operator <-> chart contract and wins over it. Operator replicas
share one kopf peering and take random priorities, so exactly one (the highest) is active and the others stand by.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from slotune.settings import env_names, load_settings

_FLAGS = {
    "prometheus_url": "Prometheus base URL; empty: no tuning, MetricsAvailable=False (NoPrometheus)",
    "runtime_image": "builtin runtime image (CUDA)",
    "runtime_image_cpu": "builtin runtime image for accelerator cpu",
    "vllm_image": "image for runtime.engine vllm",
    "watch_namespaces": "comma-separated namespaces to serve; empty: all",
    "peering": "kopf peering name shared by the operator replicas; empty: standalone (one replica only)",
    "log_level": "DEBUG, INFO, WARNING or ERROR",
    "liveness_endpoint": "liveness URL kopf serves (default http://0.0.0.0:8080/healthz); empty: none",
    "metrics_port": "port serving the operator's own metrics (tick lag, API requests, PromQL queries); 0: none",
    "admin_transport": "how /admin/config is reached: direct (pod IP) or proxy (API server pod proxy)",
    "pod_endpoints_file": "test harness only: JSON {NAMESPACE/POD: URL} overriding where pods are reached",
    "tick_s": "seconds between two looks at a TunedModel while a rollout or retry is in flight",
    "workers": "threads for API server and Prometheus requests, shared by all TunedModels",
    "rollout_timeout_s": "longest wait for a rollout before a change counts as failed",
    "unschedulable_grace_s": "how long a new pod may stay unschedulable before its rollout counts as failed",
    "network_policy_clients": "JSON NetworkPolicyPeers admitted to the runtime pods' serving port; empty: no policy",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    variables = env_names()
    for name, text in _FLAGS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, default=None,
                            help=f"{text} (env {variables[name]})")


def run(args: argparse.Namespace) -> NoReturn:
    # Flags win over the environment; the handlers read the settings from the environment at start-up.
    for name, variable in env_names().items():
        if (value := getattr(args, name, None)) is not None:
            os.environ[variable] = value
    settings = load_settings()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import kopf

    import slotune.controller.handlers  # noqa: F401  (registers the handlers with kopf)
    from slotune.controller.peering import ServingCheck, resolve_peering

    namespaces = settings.watch_namespaces
    peering = resolve_peering(settings)
    check = ServingCheck(settings)
    check()  # says at start, in the log, what keeps the operator from serving
    kopf.on.probe(id="serving")(_probe(check))
    asyncio.run(kopf.operator(
        clusterwide=not namespaces, namespaces=namespaces, standalone=peering is None, peering_name=peering,
        priority=secrets.randbelow(2**31 - 1) + 1,
        liveness_endpoint=settings.liveness_endpoint or None,
    ))
    # Stopped: the daemons are gone, the cleanup ran, and every TunedModel's state is in its status. The
    # interpreter's own exit would still join each worker thread in a call (a tick's request to a busy API server,
    # a read's last query) and tear down a heap of hundreds of MiB: at 1,000 TunedModels the process exited 8-10 s
    # after kopf's cleanup had finished, nothing logged in between. The log is flushed, then the process ends.
    logging.getLogger(__name__).info("stopped: the event loop ended; exiting")
    logging.shutdown()
    os._exit(0)


def _probe(check: Callable[[], dict[str, object]]) -> Callable[..., Awaitable[dict[str, object]]]:
    async def serving(**_: Any) -> dict[str, object]:
        return await asyncio.to_thread(check)  # blocking HTTP calls, off kopf's event loop
    return serving
