"""The one work queue for both triggers (the Alertmanager webhook and the pod watch): bounded
background work, folded per workload.

Each alert or watched crash becomes a `Work` with a fold key (`fold_key`: which pending work
shares a worker) and an identity (an alert: cluster, namespace, pod, container; a watched crash:
its fold key, so the watch keeps at most one pending crash per workload). Pending work is held in
at most `queue_size` work items, one per fold key:

- an alert for a workload that already has a pending item joins it; the same pod again replaces
  its earlier alert (the latest status wins) and is counted as a duplicate;
- a new workload gets an item of its own while there is room, otherwise it joins an existing
  pending item (round-robin), so a batch never needs more room than there is;
- only when `max_pending_alerts` distinct alerts are already waiting is a batch refused whole
  (503, Alertmanager retries): the bot is then far behind and must say so.

A 10,000-alert storm over 50 workloads is therefore at most 50 items and one handler call per
distinct pod, never a 503; a crash storm of 3,000 pods over 750 workloads through the watch is at
most 750 pending crashes, one per workload, and none is dropped.

Workers run in parallel across workloads and in order within one: an item is taken only when none
of its fold keys is being worked on (`busy`), so two alerts of one workload never run at the same
time, and the later one never overtakes the earlier. The pool size is `workers`
(VLLM_ONCALL_WORKERS, default 16: the work waits on the Kubernetes API and Slack far more than it
computes, so on 2 cores many more threads than cores keep both busy: see bot/cli/settings.py).

The fold key is not an owner: it decides only which work waits together. Which workload a pod
belongs to, the one a fix would change, is read from the cluster and checked
(bot.remedy.ownership.resolve_owner); a pod whose name misleads the fold key costs a worker's
turn, never a wrong incident.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)
OUTCOMES = ("queued", "folded", "duplicate")
_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # what Kubernetes uses for generated name suffixes
_GENERATED_SUFFIX = re.compile(rf"-(?:[{_CHARS}]{{1,10}}-[{_CHARS}]{{5}}|[{_CHARS}]{{5}}|[0-9]{{1,5}})$")


def fold_key(namespace: str, pod: str, cluster: str | None = None) -> str:
    """What pending work is folded by: the pod's name without the suffix Kubernetes generated
    for it (`<deployment>-<template-hash>-<5 chars>`, `<statefulset>-<ordinal>`, `<owner>-<5
    chars>`), so the pods of one workload wait in one item, whichever trigger saw them. The same
    pod in two clusters is two pods."""
    return f"{cluster + '/' if cluster else ''}{namespace}/{_GENERATED_SUFFIX.sub('', pod) or pod}"


@dataclass(frozen=True)
class Work:
    workload: str  # the fold key: what alerts and crashes are folded by (fold_key)
    identity: Hashable  # the same identity twice is the same work; the later one wins
    target: Any


@dataclass
class Admission:
    """What became of a batch's alerts: counts by outcome, and the new work items."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    items: int = 0

    @property
    def accepted(self) -> int:
        return sum(self.counts.values())


@dataclass
class WorkItem:
    handle: Callable[[Any], Any]
    keys: set[str] = field(default_factory=set)
    targets: dict[Hashable, Any] = field(default_factory=dict)

    def run(self) -> None:
        for target in self.targets.values():
            try:
                self.handle(target)
            except Exception:
                log.exception("alert work failed")


class WorkQueue:
    """Worker threads over at most `queue_size` pending work items (see the module docstring)."""

    def __init__(self, workers: int, queue_size: int, max_pending_alerts: int = 100_000, name: str = "alert"):
        self.capacity = max(1, queue_size)
        self.max_pending_alerts = max_pending_alerts
        self.queue: deque[WorkItem] = deque()
        self.by_key: dict[str, WorkItem] = {}
        self.pending_alerts = 0
        self.peak_pending = 0  # the most alerts and crashes ever waiting at once: what memory held
        self.running = 0
        self.busy: set[str] = set()  # the fold keys of the items being worked on now
        self._next_fold = 0
        self._stopped = False
        self._lock = threading.Lock()
        # Two conditions on the one lock, so each wakes only whom it concerns: one worker when
        # there is an item to take (not every idle worker per alert: a herd of 16 threads woken to
        # find nothing costs more CPU than the queue itself), and whoever waits for idleness.
        self._ready_to_take = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(max(1, workers))]
        for thread in self._threads:
            thread.start()

    def submit(self, works: list[Work], handle: Callable[[Any], Any]) -> Admission | None:
        """Take every alert of a batch, or none (None) when too many are waiting already."""
        with self._lock:
            if self.pending_alerts + len(works) > self.max_pending_alerts:
                return None
            admission = Admission()
            for work in works:
                item, outcome = self._item_for(work.workload, handle, admission)
                if work.identity in item.targets:
                    outcome = "duplicate"
                    del item.targets[work.identity]  # re-inserted below, in arrival order
                else:
                    self.pending_alerts += 1
                item.targets[work.identity] = work.target
                admission.counts[outcome] += 1
            self.peak_pending = max(self.peak_pending, self.pending_alerts)
            if admission.items:  # a new item may be ready (an alert folded into one changes no readiness)
                self._ready_to_take.notify()
            return admission

    def _item_for(self, key: str, handle: Callable[[Any], Any], admission: Admission) -> tuple[WorkItem, str]:
        item = self.by_key.get(key)
        if item is not None and item.handle == handle:
            return item, "folded"
        if len(self.queue) < self.capacity:
            item = WorkItem(handle)
            self.queue.append(item)
            admission.items += 1
            outcome = "queued"
        else:  # no room for another item: share one that is waiting
            self._next_fold = (self._next_fold + 1) % len(self.queue)
            item = self.queue[self._next_fold]
            outcome = "folded"
        item.keys.add(key)
        self.by_key[key] = item
        return item, outcome

    def _ready(self) -> WorkItem | None:
        """The oldest pending item none of whose workloads is being worked on (the lock held)."""
        return next((item for item in self.queue if self.busy.isdisjoint(item.keys)), None)

    def _work(self) -> None:
        while True:
            with self._lock:
                self._ready_to_take.wait_for(lambda: self._stopped or self._ready() is not None)
                if self._stopped:
                    return
                item = self._ready()
                assert item is not None  # the wait above
                self.queue.remove(item)
                for key in item.keys:
                    if self.by_key.get(key) is item:
                        del self.by_key[key]
                self.busy |= item.keys
                self.pending_alerts -= len(item.targets)
                self.running += 1
                # One wakes the next: while items are ready, whoever takes one wakes one more worker
                # (a worker finishing loops back and looks for itself).
                if self._ready() is not None:
                    self._ready_to_take.notify()
            try:
                item.run()
            finally:
                with self._lock:
                    self.running -= 1
                    self.busy -= item.keys  # what this unblocks, this thread takes as it loops
                    if self._is_idle():
                        self._idle.notify_all()

    def _is_idle(self) -> bool:
        return not self.queue and not self.running

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self._lock:
            return self._idle.wait_for(self._is_idle, timeout)

    def shutdown(self) -> None:
        with self._lock:
            self._stopped = True
            self.queue.clear()
            self.by_key.clear()
            self._ready_to_take.notify_all()
            self._idle.notify_all()


class InlineExecutor:
    """Runs each alert at once in the caller: the demo wants its output in order."""

    def wait_idle(self, timeout: float | None = None) -> bool:
        return True

    def submit(self, works: list[Work], handle: Callable[[Any], Any]) -> Admission:
        admission = Admission()
        seen: set[Hashable] = set()
        for work in works:
            outcome = "duplicate" if work.identity in seen else "queued"
            seen.add(work.identity)
            admission.counts[outcome] += 1
            handle(work.target)
        return admission
