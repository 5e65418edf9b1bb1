"""Detect a vLLM container's crash at its first termination, through a Kubernetes watch on pods.

Why: KubePodCrashLooping fires 16 to 21 minutes after the first crash (its `for: 15m` over a
5-minute CrashLoopBackOff window, plus Alertmanager's group_wait), and for a pod whose model load
outlasts 5 minutes it may never fire. The crashed container's log is complete at its first
termination, so the bot can diagnose then.

The machinery, as client-go's reflector does it, driven through the `kubernetes` client's own
`watch.Watch`:
- list, then watch from the list's resourceVersion; `allowWatchBookmarks` so a quiet watch still
  moves its resourceVersion on; each watch ends after `timeout_seconds` and resumes from the last
  resourceVersion seen;
- `410 Gone` (the resourceVersion was compacted away): list again and compare the list with what
  is known, so a termination that happened in the gap is still found (and one already seen is not
  reported twice);
- a dropped connection or an API error: reconnect from the last resourceVersion after a bounded,
  jittered exponential backoff (reset by a watch that worked);
- bounded memory: per pod with a vLLM container, per such container, only what tells a NEW
  termination apart: (restartCount, lastState.terminated.finishedAt). Pods without a vLLM
  container are not kept; deleted pods are forgotten.

A crash is a vLLM container whose `lastState.terminated` is new and says exit code != 0 or
OOMKilled (never CrashLoopBackOff itself: that is the kubelet's back-off afterwards). A container
is vLLM's when its image names vllm or its command line runs `vllm serve` / `vllm.entrypoints`;
with a label selector configured, every container of a selected pod counts.

The first list only learns the current state (crashes before the bot started are the alert
path's); terminations seen after it are reported. Each crash is submitted, as the alert it stands
in for, to the one work queue the webhook's alerts go to (bot.app.work), folded per workload:
at most one pending crash per workload (a later crash of the same workload replaces the waiting
one: the collect reads the pod it names, and the incident is the workload's anyway), so a storm
of 3,000 crashing pods over 750 workloads waits as 750 entries and none is dropped. The handler
runs on the queue's workers, never on the stream's thread.

Two replicas both watch and both report; only one posts: the incident's name is derived from
(cluster, workload, cause) and creating it is a create-if-absent on the store (bot.app.intake),
so the second replica's report folds into the first's incident as a repeat. No Lease is needed,
and none could be better: a Lease adds a leader election whose failover is slower than the
create, and the create is already the step that must happen once.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from bot.app.records import AlertTarget
from bot.app.work import InlineExecutor, Work, WorkQueue, fold_key
from bot.kube.api import KubeApi
from bot.kube.errors import KubeError

log = logging.getLogger("bot.kube.watch")

VLLM_COMMANDS = ("vllm serve", "vllm.entrypoints")
HTTP_GONE = 410
SEEN_VERSIONS = 256  # WatchStats.seen: bounded, a few per pod of a busy namespace


@dataclass(frozen=True)
class WatchSettings:
    namespaces: tuple[str, ...] = ()  # empty: all namespaces (one watch)
    label_selector: str | None = None  # None: all pods, vLLM containers recognised by image/command
    timeout_seconds: int = 300  # each watch request; then it resumes from its resourceVersion
    backoff_initial: float = 0.2
    backoff_max: float = 30.0


@dataclass(frozen=True)
class Crash:
    namespace: str
    pod: str
    container: str
    exit_code: int | None
    reason: str | None
    finished_at: str | None
    detected_at: float  # time.monotonic() when the watch saw it
    after_ready: bool = False  # the container had been Ready before it died: a run-time crash, not start-up


@dataclass
class WatchStats:
    lists: int = 0
    relists_after_gone: int = 0
    watches: int = 0
    reconnects: int = 0
    crashes: int = 0  # taken by the work queue (queued, folded or replacing a waiting one)
    crashes_after_ready: int = 0  # of those, containers that had been Ready (run-time OOM, EngineDeadError)
    dropped_crashes: int = 0  # the work queue refused them: max_pending_alerts already waiting
    errors: list[str] = field(default_factory=list)  # the last few, for logs and tests
    # The resourceVersions of the last pod states handled (listed or watched, crashes submitted):
    # what a test waits on instead of sleeping until the watch has "surely" seen an edit.
    seen: deque[str] = field(default_factory=lambda: deque(maxlen=SEEN_VERSIONS))


def is_vllm_container(container: dict[str, Any]) -> bool:
    if "vllm" in str(container.get("image") or "").lower():
        return True
    line = " ".join(str(p) for p in (container.get("command") or []) + (container.get("args") or []))
    return any(cmd in line for cmd in VLLM_COMMANDS)


def _watched_containers(pod: dict[str, Any], all_containers: bool) -> set[str]:
    spec = pod.get("spec") or {}
    return {c.get("name") for c in spec.get("containers") or []
            if c.get("name") and (all_containers or is_vllm_container(c))}


Seen = tuple[int, str | None]  # (restartCount, lastState.terminated.finishedAt)


def _last_termination(status: dict[str, Any]) -> dict[str, Any] | None:
    terminated = (status.get("lastState") or {}).get("terminated")
    return terminated if isinstance(terminated, dict) else None


def _is_crash(terminated: dict[str, Any]) -> bool:
    code = terminated.get("exitCode")
    return terminated.get("reason") == "OOMKilled" or (code is not None and int(code) != 0)


def _is_new(before: Seen | None, now: Seen) -> bool:
    """A termination not seen before: another finishedAt (or, without one, a higher restartCount)."""
    if before is None:
        return True
    if now[1] is not None:
        return now[1] != before[1]
    return now[0] > before[0]


class PodState:
    """What is known per pod: only enough to tell a new termination from one already seen."""

    def __init__(self, all_containers: bool):
        self.all_containers = all_containers
        self.pods: dict[tuple[str, str], dict[str, Seen]] = {}
        # containers seen Ready since their last termination: a crash of one of them happened while
        # serving (hours after start, or on a first request), which a restart count alone cannot tell
        self.was_ready: set[tuple[str, str, str]] = set()

    def observe(self, pod: dict[str, Any], report: bool) -> list[tuple[str, dict[str, Any], bool]]:
        """Record the pod; return its containers' new crash terminations (when `report`), each with
        whether that container had been Ready before it."""
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        names = _watched_containers(pod, self.all_containers)
        if not names:
            self.pods.pop(key, None)
            return []
        known = self.pods.get(key)
        seen: dict[str, Seen] = {}
        new: list[tuple[str, dict[str, Any], bool]] = []
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            name = status.get("name")
            if name not in names:
                continue
            terminated = _last_termination(status)
            now: Seen = (int(status.get("restartCount") or 0), (terminated or {}).get("finishedAt"))
            seen[name] = now
            before = (known or {}).get(name)
            ready_key = (*key, str(name))
            if terminated is not None and _is_new(before, now):
                if _is_crash(terminated) and report:
                    new.append((name, terminated, ready_key in self.was_ready))
                self.was_ready.discard(ready_key)  # a new run: Ready must be seen again
            if status.get("ready") is True:
                self.was_ready.add(ready_key)
        self.pods[key] = seen
        return new

    def forget(self, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        self.pods.pop(key, None)
        self.was_ready = {k for k in self.was_ready if k[:2] != key}

    def keep_only(self, keys: Iterable[tuple[str, str]], namespace: str | None) -> None:
        """After a relist: forget pods of this namespace (or all) that no longer exist."""
        alive = set(keys)
        for key in list(self.pods):
            if (namespace is None or key[0] == namespace) and key not in alive:
                del self.pods[key]
        self.was_ready = {k for k in self.was_ready if k[:2] in self.pods}


class Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


class PodWatch:
    """Watch pods; submit each new vLLM container termination, as an AlertTarget for `handle`, to
    the work queue `work`. `cluster`: the served cluster's name when several are served (the
    router routes by it), else None. start()/stop()."""

    def __init__(self, api: KubeApi, work: WorkQueue | InlineExecutor, handle: Callable[[AlertTarget], object],
                 settings: WatchSettings | None = None, sleep: Callable[[float], object] | None = None,
                 cluster: str | None = None):
        self.api, self.work, self.handle, self.cluster = api, work, handle, cluster
        self.settings = settings or WatchSettings()
        self.state = PodState(all_containers=self.settings.label_selector is not None)
        self.stats = WatchStats()
        self._lock = threading.Lock()  # self.state is shared by the namespaces' threads
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._watches: list[Any] = []
        self._threads: list[threading.Thread] = []

    # -- lifecycle
    def start(self) -> PodWatch:
        scopes: list[str | None] = list(self.settings.namespaces) or [None]
        for ns in scopes:
            self._threads.append(threading.Thread(target=self._run, args=(ns,), daemon=True,
                                                  name=f"pod-watch-{ns or 'all'}"))
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for w in list(self._watches):
            w.close()  # unblocks the read the stream is waiting in
        for thread in self._threads:
            thread.join(timeout)

    # -- one namespace (or all): list, watch, relist on 410, reconnect on errors
    def _run(self, namespace: str | None) -> None:
        rv: str | None = None
        first = True
        delay = self.settings.backoff_initial
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self._list(namespace, report=not first)
                    first = False
                rv, worked = self._follow(namespace, rv)
                if worked:
                    delay = self.settings.backoff_initial
            except Gone:
                self.stats.relists_after_gone += 1
                log.info("pod watch (%s): resourceVersion %s expired; listing again", namespace or "all", rv)
                rv = None
                continue
            except Exception as exc:
                if self._stop.is_set():
                    return
                self._error(namespace, exc)
                self.stats.reconnects += 1
                self._sleep(delay * (0.5 + random.random() / 2))
                delay = min(self.settings.backoff_max, delay * 2)

    def _error(self, namespace: str | None, exc: BaseException) -> None:
        text = " ".join(str(exc).split())[:300] or type(exc).__name__
        self.stats.errors = (self.stats.errors + [text])[-10:]
        log.warning("pod watch (%s) failed, reconnecting: %s", namespace or "all", text)

    def _list(self, namespace: str | None, report: bool) -> str:
        """The initial list, page by page (limit/continue): each page is observed and let go
        before the next is read, so 10,000 pods are never held at once."""
        rv = ""
        seen: list[tuple[str, str]] = []
        found = []
        for items, page_version in self.api.pod_pages(namespace, self.settings.label_selector):
            rv = page_version  # every page carries the list's resourceVersion: watch from it
            with self._lock:
                for pod in items:
                    meta = pod.setdefault("metadata", {})
                    if namespace is not None:
                        meta.setdefault("namespace", namespace)
                    seen.append((meta.get("namespace", ""), meta.get("name", "")))
                    found.extend(self._observe(pod, report))
        self.stats.lists += 1
        with self._lock:
            self.state.keep_only(seen, namespace)
        for crash in found:
            self._submit(crash)
        self.stats.seen.extend(str(p["metadata"].get("resourceVersion") or "") for p in items)
        self.stats.seen.append(rv)
        return rv

    def _follow(self, namespace: str | None, rv: str) -> tuple[str, bool]:
        """One watch request from `rv` until it ends; -> (last resourceVersion, saw anything)."""
        self.stats.watches += 1
        opened: list[Any] = []
        worked = False
        try:
            for event in self.api.watch_pods(namespace, rv, self.settings.label_selector,
                                             self.settings.timeout_seconds, on_open=self._opened(opened)):
                worked = True
                rv = self._event(event, rv)
                if self._stop.is_set():
                    break
        except KubeError as exc:
            if exc.status == HTTP_GONE:
                raise Gone() from None
            raise
        finally:
            for w in opened:
                self._watches.remove(w)
        return rv, worked

    def _opened(self, opened: list[Any]) -> Callable[[Any], None]:
        def keep(w: Any) -> None:
            opened.append(w)
            self._watches.append(w)
        return keep

    def _event(self, event: dict[str, Any], rv: str) -> str:
        obj = event.get("object") or {}
        kind = event.get("type")
        new_rv = str(((obj.get("metadata") or {}).get("resourceVersion")) or rv)
        if kind == "BOOKMARK":
            return new_rv
        found: list[Crash] = []
        with self._lock:
            if kind == "DELETED":
                self.state.forget(obj)
            elif kind in ("ADDED", "MODIFIED"):
                found = self._observe(obj, report=True)
        for crash in found:
            self._submit(crash)
        self.stats.seen.append(new_rv)
        return new_rv

    def _observe(self, pod: dict[str, Any], report: bool) -> list[Crash]:
        meta = pod.get("metadata") or {}
        now = time.monotonic()
        return [Crash(namespace=str(meta.get("namespace") or ""), pod=str(meta.get("name") or ""), container=name,
                      exit_code=terminated.get("exitCode"), reason=terminated.get("reason"),
                      finished_at=terminated.get("finishedAt"), detected_at=now, after_ready=after_ready)
                for name, terminated, after_ready in self.state.observe(pod, report)]

    # -- the crashes: into the one work queue, folded per workload
    def _submit(self, crash: Crash) -> None:
        key = fold_key(crash.namespace, crash.pod, self.cluster)
        # Identity = the fold key: one pending crash per workload, the latest replacing the one waiting.
        admission = self.work.submit([Work(key, ("watch", key), as_alert(crash, self.cluster))], self.handle)
        if admission is None:
            self.stats.dropped_crashes += 1
            log.warning("pod watch: the work queue is full, %s/%s left to the alert path", crash.namespace, crash.pod)
            return
        self.stats.crashes += 1
        self.stats.crashes_after_ready += crash.after_ready
        log.info("pod watch: %s/%s container %s terminated (exit %s, %s)%s", crash.namespace, crash.pod,
                 crash.container, crash.exit_code, crash.reason, " after it had been Ready" if crash.after_ready else "")


def as_alert(crash: Crash, cluster: str | None = None) -> AlertTarget:
    """The crash as the alert it stands in for: the same incident, the same thread."""
    return AlertTarget(namespace=crash.namespace, pod=crash.pod, container=crash.container,
                       received_at=crash.detected_at, cluster=cluster)
