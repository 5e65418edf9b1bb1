"""Bounded background work for the webhook: a batch gets room for all its jobs or none."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger(__name__)


class BoundedExecutor:
    """A thread pool with a bounded queue: submit_all() takes room for a whole batch or none."""

    def __init__(self, workers: int, queue_size: int, name: str = "alert"):
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self.slots = threading.BoundedSemaphore(workers + queue_size)
        self.idle = threading.Condition()
        self.pending = 0

    def submit_all(self, jobs: list[Callable[[], Any]]) -> bool:
        taken = 0
        for _ in jobs:
            if not self.slots.acquire(blocking=False):
                for _ in range(taken):
                    self.slots.release()
                return False
            taken += 1
        with self.idle:
            self.pending += len(jobs)
        for job in jobs:
            self.pool.submit(self._run, job)
        return True

    def _run(self, job: Callable[[], Any]) -> None:
        try:
            job()
        except Exception:
            log.exception("background job failed")
        finally:
            self.slots.release()
            with self.idle:
                self.pending -= 1
                self.idle.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self.idle:
            return self.idle.wait_for(lambda: self.pending == 0, timeout)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class InlineExecutor:
    """Runs each job at once in the caller: the demo wants its output in order."""

    def submit_all(self, jobs: list[Callable[[], Any]]) -> bool:
        for job in jobs:
            job()
        return True
