"""The work queue's pool: parallel across workloads, in order within one (issue 20).

Every wait here is on an event the work itself sets; the time-outs only bound a failure."""

from __future__ import annotations

import threading

from bot.app.work import Work, WorkQueue

BOUND = 60  # seconds: only ever reached when the behaviour is wrong


class Recorder:
    """A handler that records what it runs, and holds the items of gated workloads until released."""

    def __init__(self, gated: set[str]):
        self.gated = gated
        self.gate = threading.Event()
        self.lock = threading.Condition()
        self.started: list[str] = []
        self.finished: list[str] = []
        self.running: set[str] = set()
        self.overlaps: list[str] = []

    def __call__(self, target: tuple[str, str]) -> None:
        workload, name = target
        with self.lock:
            if workload in self.running:
                self.overlaps.append(name)
            self.running.add(workload)
            self.started.append(name)
            self.lock.notify_all()
        if workload in self.gated:
            assert self.gate.wait(BOUND)
        with self.lock:
            self.running.discard(workload)
            self.finished.append(name)
            self.lock.notify_all()

    def wait(self, predicate) -> bool:
        with self.lock:
            return self.lock.wait_for(predicate, BOUND)


def work(workload: str, name: str) -> Work:
    return Work(workload=workload, identity=name, target=(workload, name))


def test_another_workload_runs_while_one_is_busy_and_the_busy_ones_later_item_waits():
    queue = WorkQueue(workers=2, queue_size=10)
    handler = Recorder(gated={"a"})
    try:
        queue.submit([work("a", "a1")], handler)
        assert handler.wait(lambda: "a1" in handler.started)
        # a's second alert comes while a1 runs: a worker is free, but it must take b1, not a2
        queue.submit([work("a", "a2")], handler)
        queue.submit([work("b", "b1")], handler)
        assert handler.wait(lambda: "b1" in handler.finished), handler.started
        assert "a2" not in handler.started
        handler.gate.set()
        assert queue.wait_idle(BOUND)
    finally:
        handler.gate.set()
        queue.shutdown()
    assert handler.started.index("a1") < handler.started.index("a2")
    assert handler.overlaps == []


def test_many_workloads_in_parallel_each_in_order_never_concurrent():
    queue = WorkQueue(workers=4, queue_size=8)
    handler = Recorder(gated=set())
    try:
        for i in range(30):
            queue.submit([work(f"w{w}", f"w{w}-{i:02d}") for w in range(6)], handler)
        assert queue.wait_idle(BOUND)
    finally:
        queue.shutdown()
    assert handler.overlaps == []
    for w in range(6):
        mine = [name for name in handler.finished if name.startswith(f"w{w}-")]
        assert mine == sorted(mine)  # never reordered
        assert len(mine) == 30  # none lost


def test_the_pool_runs_up_to_its_size_at_once():
    queue = WorkQueue(workers=3, queue_size=10)
    handler = Recorder(gated={"a", "b", "c", "d"})
    try:
        queue.submit([work(w, f"{w}1") for w in "abcd"], handler)
        assert handler.wait(lambda: len(handler.started) == 3)
        assert len(handler.running) == 3 and "d1" not in handler.started
        handler.gate.set()
        assert queue.wait_idle(BOUND)
    finally:
        handler.gate.set()
        queue.shutdown()
    assert sorted(handler.finished) == ["a1", "b1", "c1", "d1"]


class Gates:
    """A handler holding each named alert until its gate opens; records what started."""

    def __init__(self, held: set[str]):
        self.gates = {name: threading.Event() for name in held}
        self.lock = threading.Condition()
        self.started: list[str] = []

    def __call__(self, target: tuple[str, str]) -> None:
        name = target[1]
        with self.lock:
            self.started.append(name)
            self.lock.notify_all()
        if name in self.gates:
            assert self.gates[name].wait(BOUND)

    def wait_started(self, *names: str) -> bool:
        with self.lock:
            return self.lock.wait_for(lambda: all(n in self.started for n in names), BOUND)

    def release(self, *names: str) -> None:
        for name in names:
            self.gates[name].set()


def test_an_item_that_frees_two_workloads_lets_two_waiting_items_run_at_once():
    """Workers are woken one at a time (one per item to take, each waking the next): when a
    finished item frees two workloads, both of their waiting items start, on two workers."""
    queue = WorkQueue(workers=3, queue_size=2)
    handler = Gates(held={"p1", "q1", "p2", "q2", "q3", "r2"})
    try:
        queue.submit([work("p", "p1")], handler)
        queue.submit([work("q", "q1")], handler)
        assert handler.wait_started("p1", "q1")
        queue.submit([work("p", "p2")], handler)  # waits for p
        queue.submit([work("q", "q2")], handler)  # waits for q; the queue is full
        queue.submit([work("r", "r1")], handler)  # no room: shares q2's item, which now holds q and r
        handler.release("p1")
        assert handler.wait_started("p2")
        handler.release("q1")
        assert handler.wait_started("q2")  # q2's item runs, holding q and r
        queue.submit([work("q", "q3")], handler)
        queue.submit([work("r", "r2")], handler)
        handler.release("q2")  # frees q and r at once
        assert handler.wait_started("r1", "q3", "r2")
        assert not handler.gates["p2"].is_set()  # p2 still holds the third worker
    finally:
        for gate in handler.gates.values():
            gate.set()
        assert queue.wait_idle(BOUND)
        queue.shutdown()
    assert handler.started.index("q2") < handler.started.index("q3")
