"""The operator's children as a watch keeps them: a tick reads its Deployment and Secret here, not with a GET.

One list-then-watch per kind (cluster-wide, or per watched namespace), restricted to the objects slotune manages
(`app.kubernetes.io/managed-by=slotune`), on its own thread and its own HTTP connection (a watch holds one for
minutes, and the shared client's connections bound the requests in flight). At 1,000 TunedModels each tick's
Deployment GET (and the Secret's every LOOK_S) was most of the operator's requests to an API server that answered
~70 a second: the ticks of a window queued behind each other for up to a minute.

Never staler than what slotune wrote: a write's answer goes into the cache (`put`) unless the watch already holds a
newer version, so a tick right after an apply sees the new generation, not the rollout before it. A watch that ends
is resumed from its last resourceVersion; one that breaks or expires (410 Gone) lists again, and the objects the
list returns replace the store, except those written since with a newer version. Until the first list answered
(`synced`), reads go to the API server (`KubeAPI.read`).

A connection is only ever used, and closed, by the thread that owns it. `stop` wakes a watch blocked reading by
shutting its socket down (the reader sees the end of the stream and closes its own client), never by closing the
client under it: a socket closed by another thread frees its file descriptor while the reader is still in recv, the
number goes to the next connection opened (the next test's client, a new cache), and the old reader's next recv takes
that connection's TLS records. Its owner then fails with DECRYPTION_FAILED_OR_BAD_RECORD_MAC (seen once in
tests/integration/test_operator_child_cache.py). The SSLContext shared by every client is not the cause: wrapping
sockets from one context is thread-safe; an SSL socket read by two threads is not.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import socket
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import httpx

from slotune.backends.kube_api import Credentials, object_path

log = logging.getLogger(__name__)
MANAGED = "app.kubernetes.io/managed-by=slotune"
WATCH_S = 300  # a watch's server-side timeout; it is resumed from where it ended
RETRY_S = 1.0


def _version(obj: dict[str, Any]) -> int:
    """resourceVersion as a number (etcd's revision: ordered); unparseable ones count as newest."""
    try:
        return int(obj["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return 1 << 62


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


class KindCache:
    """One kind's managed objects in one namespace ("" = all), kept by a list and a watch."""

    def __init__(self, credentials: Credentials, kind: str, namespace: str, label_selector: str = MANAGED,
                 watch_s: int = WATCH_S) -> None:
        self.kind = kind
        self.namespace = namespace
        self._credentials = credentials
        self._selector = label_selector
        self._watch_s = watch_s
        self._lock = threading.Lock()
        self._objects: dict[tuple[str, str], dict[str, Any]] = {}
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._http = httpx.Client(base_url=credentials.host, verify=credentials.tls,
                                  timeout=httpx.Timeout(10.0, read=watch_s + 30.0))
        self._reading: socket.socket | None = None  # the socket a watch reads now (woken by `stop`)
        self._thread = threading.Thread(target=self._run, name=f"slotune-watch-{kind.lower()}", daemon=True)
        self.relists = 0
        self.watches = 0  # watches started (each resumes from the last version seen)

    def start(self) -> KindCache:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 0.0) -> bool:
        """Stop watching: a watch blocked reading sees its stream end, and the watch thread closes its client.
        Waits up to `timeout_s` for that thread; returns whether it ended."""
        self._stop.set()
        with self._lock:
            if self._reading is not None:
                with contextlib.suppress(OSError):  # the plain socket's shutdown: the SSL state stays the reader's
                    socket.socket.shutdown(self._reading, socket.SHUT_RDWR)
        if not self._thread.is_alive():
            if self._thread.ident is None:  # never started: nobody else uses the client
                self._http.close()
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout_s: float) -> bool:
        return self._synced.wait(timeout_s)

    def covers(self, namespace: str) -> bool:
        return self.namespace in ("", namespace)

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            found = self._objects.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def put(self, obj: dict[str, Any]) -> None:
        """An object as slotune's own write returned it: kept unless the cache already holds a newer version."""
        with self._lock:
            held = self._objects.get(_key(obj))
            if held is None or _version(obj) >= _version(held):
                self._objects[_key(obj)] = obj

    # --- the watch thread ---------------------------------------------------------------------------------
    def _path(self) -> str:
        if self.namespace:
            return object_path(self.kind, self.namespace)
        prefix, plural = object_path(self.kind, "x").split("/namespaces/x/")
        return f"{prefix}/{plural}"

    def _headers(self) -> dict[str, str]:
        sent = {"Accept": "application/json"}
        if (authorization := self._credentials.authorization()) is not None:
            sent["Authorization"] = authorization
        return sent

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    version = self._list()
                    while version is not None and not self._stop.is_set():
                        version = self._watch(version)
                except Exception as error:  # the API server restarting, a dropped connection: list again
                    if self._stop.is_set():
                        return
                    log.warning("watch of %s broke, listing again: %s: %s", self.kind, type(error).__name__, error)
                self.relists += 1
                self._stop.wait(RETRY_S)
        finally:
            self._http.close()  # on this thread, the only one that used it

    def _list(self) -> str:
        response = self._http.get(self._path(), params={"labelSelector": self._selector}, headers=self._headers())
        response.raise_for_status()
        body = response.json()
        listed = body["metadata"]["resourceVersion"]
        fresh = {_key(item): item for item in body.get("items", [])}
        with self._lock:
            # Written since the list was taken (a newer version than the list's): kept.
            for key, held in self._objects.items():
                if _version(held) > _version({"metadata": {"resourceVersion": listed}}):
                    fresh[key] = held
            self._objects = fresh
        self._synced.set()
        return listed

    def _watch(self, version: str) -> str | None:
        """Follow the watch from `version` until it ends; the version to resume from, or None to list again."""
        params = {"labelSelector": self._selector, "watch": "1", "resourceVersion": version,
                  "allowWatchBookmarks": "true", "timeoutSeconds": str(self._watch_s)}
        self.watches += 1
        with self._http.stream("GET", self._path(), params=params, headers=self._headers()) as response:
            if response.status_code == 410:
                return None
            response.raise_for_status()
            with self._held(response) as live:
                return self._follow(response, version) if live else None

    @contextlib.contextmanager
    def _held(self, response: httpx.Response) -> Iterator[bool]:
        """While the watch reads `response`, `stop` can wake it through its socket (and no longer once it is
        done: the connection goes back to the pool, or is closed, by this thread). Yields whether to read at all:
        a stop just before the socket was known would wake nothing."""
        stream = response.extensions.get("network_stream")
        with self._lock:
            self._reading = stream.get_extra_info("socket") if stream is not None else None
        try:
            yield not self._stop.is_set()
        finally:
            with self._lock:
                self._reading = None

    def _follow(self, response: httpx.Response, version: str) -> str | None:
        for line in response.iter_lines():
            if not line:
                continue
            event = json.loads(line)
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":  # 410 Gone: the version is too old to resume from
                return None
            version = obj.get("metadata", {}).get("resourceVersion", version)
            if kind == "BOOKMARK":
                continue
            with self._lock:
                held = self._objects.get(_key(obj))
                if held is not None and _version(obj) < _version(held):
                    continue  # slotune wrote it again since (a Secret re-created after a delete)
                if kind == "DELETED":
                    self._objects.pop(_key(obj), None)
                else:
                    self._objects[_key(obj)] = obj
        return version


class ChildCache:
    """The kinds slotune reads on every tick, for the namespaces it serves (empty: all)."""

    KINDS = ("Deployment", "Secret")

    def __init__(self, credentials: Credentials, namespaces: Iterable[str] = (), watch_s: int = WATCH_S) -> None:
        spaces = tuple(namespaces) or ("",)
        self._caches = [KindCache(credentials, kind, ns, watch_s=watch_s) for kind in self.KINDS for ns in spaces]

    def start(self) -> ChildCache:
        for cache in self._caches:
            cache.start()
        return self

    def stop(self, timeout_s: float = 0.0) -> bool:
        """Stop every watch; with `timeout_s`, wait that long in all for their threads; whether all ended."""
        for cache in self._caches:
            cache.stop()
        return all(cache.stop(timeout_s / len(self._caches)) for cache in self._caches)

    def wait_synced(self, timeout_s: float) -> bool:
        return all(cache.wait_synced(timeout_s) for cache in self._caches)

    def of(self, kind: str, namespace: str) -> KindCache | None:
        """The synced cache that holds `kind` in `namespace`, or None (read from the API server)."""
        return next((c for c in self._caches if c.kind == kind and c.covers(namespace) and c.synced), None)

    @property
    def relists(self) -> int:
        return sum(cache.relists for cache in self._caches)
