"""Which kopf peering the operator runs with, and a clear word when the configured one cannot work.

kopf with a peering name waits for the peering object before it serves anything, and says nothing while it waits: an
operator started by hand after `kubectl apply -f crds/` (the default name, no peering object) looked idle with no
reason given. Before kopf starts, `choose_peering` looks: no peering CRD at all means nobody else can peer, so the
operator runs standalone and says so; the CRD without the object means the operator would wait forever, so it says
what to create (or how to run standalone) and waits as configured, since standing alone could make two replicas
active at once.

`serving_problems` asks the same of everything else the operator needs (the TunedModel CRD, RBAC to list
TunedModels, the peering object): an operator missing one of them runs but serves nothing, so it says which in its
log and in its liveness probe's answer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from slotune.api import GROUP, PLURAL, VERSION
from slotune.backends.kube_api import KubeAPI, KubeError
from slotune.settings import OperatorSettings

log = logging.getLogger(__name__)
PEERING_GROUP_VERSION = "kopf.dev/v1"


@dataclass(frozen=True)
class PeeringChoice:
    name: str | None  # None: standalone
    warning: str = ""


def _missing(api: KubeAPI, settings: OperatorSettings) -> list[str]:
    """The peering objects the settings need that do not exist, as `kind/name` (namespaced ones with namespace)."""
    name = settings.peering
    if not settings.watch_namespaces:
        found = api.get(f"/apis/{PEERING_GROUP_VERSION}/clusterkopfpeerings/{name}")
        return [] if found is not None else [f"ClusterKopfPeering {name}"]
    return [f"KopfPeering {namespace}/{name}" for namespace in settings.watch_namespaces
            if api.get(f"/apis/{PEERING_GROUP_VERSION}/namespaces/{namespace}/kopfpeerings/{name}") is None]


def choose_peering(api: KubeAPI, settings: OperatorSettings) -> PeeringChoice:
    if not settings.peering:
        return PeeringChoice(None)
    plural = "kopfpeerings" if settings.watch_namespaces else "clusterkopfpeerings"
    if not api.has_resource(PEERING_GROUP_VERSION, plural):
        return PeeringChoice(None, f"peering {settings.peering!r} is configured but the cluster has no kopf peering "
                             f"CRD ({plural}.kopf.dev): running standalone. Run one replica only, or install the "
                             "chart's peering (charts/slotune, peering.create) for several.")
    missing = _missing(api, settings)
    if not missing:
        return PeeringChoice(settings.peering)
    return PeeringChoice(settings.peering, f"peering {settings.peering!r} is configured but {', '.join(missing)} "
                         "does not exist: kopf serves nothing until it does. Create it (the chart does, "
                         "peering.create) or run standalone with SLOTUNE_PEERING='' (--peering '').")


def resolve_peering(settings: OperatorSettings) -> str | None:
    """The peering name to give kopf (None: standalone), logging a warning where the configuration cannot work as
    written. A failure to look (no API server yet) leaves the configuration as it is: kopf reports that itself."""
    if not settings.peering:
        return None
    try:
        api = KubeAPI.from_environment()
    except Exception as error:  # no kubeconfig: kopf's own login error says it better
        log.debug("peering check skipped: %s", error)
        return settings.peering
    try:
        choice = choose_peering(api, settings)
    except (KubeError, OSError) as error:
        log.warning("could not check peering %r: %s", settings.peering, error)
        return settings.peering
    finally:
        api.close()
    if choice.warning:
        log.warning(choice.warning)
    return choice.name


def _listing_problem(api: KubeAPI, settings: OperatorSettings) -> str | None:
    """Why the operator cannot list TunedModels where it watches (RBAC, most often), or None."""
    scopes = [f"/namespaces/{n}" for n in settings.watch_namespaces] or [""]
    for scope in scopes:
        response = api.request("GET", f"/apis/{GROUP}/{VERSION}{scope}/{PLURAL}", params={"limit": "1"})
        if response.status_code >= 400:
            where = scope.removeprefix("/namespaces/") or "all namespaces"
            return (f"cannot list TunedModels in {where} ({response.status_code}): {response.text.strip()[:300]}; "
                    "grant list/watch on tunedmodels.slotune.io (the chart's ClusterRole does)")
    return None


def serving_problems(api: KubeAPI, settings: OperatorSettings) -> list[str]:
    """Everything that keeps the operator from serving TunedModels; empty when it can."""
    if not api.has_resource(f"{GROUP}/{VERSION}", PLURAL):
        return [f"the TunedModel CRD ({PLURAL}.{GROUP}) is not installed: apply crds/tunedmodel.yaml (the chart "
                "installs it); nothing is served until it exists"]
    problems = [p for p in [_listing_problem(api, settings)] if p]
    # No peering CRD at all: choose_peering ran the operator standalone, so no peering object is awaited.
    plural = "kopfpeerings" if settings.watch_namespaces else "clusterkopfpeerings"
    awaited = bool(settings.peering) and api.has_resource(PEERING_GROUP_VERSION, plural)
    if awaited and (missing := _missing(api, settings)):
        problems.append(f"peering {settings.peering!r}: {', '.join(missing)} does not exist; kopf serves nothing "
                        "until it does")
    return problems


class ServingCheck:
    """The liveness probe's look at `serving_problems`, logging a warning each time the answer changes (not at
    every probe: kubelet probes every few seconds)."""

    def __init__(self, settings: OperatorSettings) -> None:
        self.settings = settings
        self.last: list[str] | None = None

    def __call__(self) -> dict[str, object]:
        try:
            api = KubeAPI.from_environment()
        except Exception as error:  # no credentials: say so rather than fail the probe blindly
            problems = [f"no API server credentials: {error}"]
        else:
            try:
                problems = serving_problems(api, self.settings)
            except (KubeError, OSError) as error:
                problems = [f"the API server did not answer: {error}"]
            finally:
                api.close()
        if problems != self.last:
            for problem in problems:
                log.warning("cannot serve: %s", problem)
            if self.last and not problems:
                log.info("serving: every prerequisite is in place")
            self.last = problems
        return {"serving": not problems, "problems": problems}
