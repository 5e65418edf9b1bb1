"""No needless round trips on large namespaces (issue 20): a vanished pod is looked up through its
workload's selector, never by listing the namespace; every list is paginated (limit/continue),
the pod watch's initial list included. Against the Kubernetes API stand-in, which pages as
kube-apiserver does and records every request."""

from __future__ import annotations

import time

import pytest
from kubeapi.objects import crashing_deployment, crowd, start_pod
from kubeapi.server import FakeKube
from standin_http import bound

from bot.app.work import WorkQueue
from bot.kube.api import KubeApi
from bot.kube.errors import PodGone
from bot.kube.live import LiveCluster
from bot.kube.retry import RetryPolicy
from bot.kube.watch import PodWatch, WatchSettings

NS = "inference"


@pytest.fixture
def kube():
    fake = FakeKube().start()
    yield fake
    fake.stop()


def pod_lists(kube: FakeKube) -> list:
    return [c for c in kube.calls if c.verb == "list" and c.resource == "pods"]


def test_a_vanished_pod_among_thousands_is_looked_up_by_its_workloads_selector(kube):
    crowd(kube, 2000)
    dep, pod = crashing_deployment(kube)
    newer = start_pod(kube, dep, "crashloop", suffix="q7x2z")
    gone = pod["metadata"]["name"][:-5] + "aaaaa"
    cluster = LiveCluster(KubeApi(kube.api_client(), retry=RetryPolicy(attempts=1)))
    kube.calls.clear()

    with pytest.raises(PodGone) as info:
        cluster.collect(NS, gone)

    assert info.value.newest_of_workload == newer["metadata"]["name"]
    lists = pod_lists(kube)
    assert len(lists) == 1 and lists[0].query.get("labelSelector")  # never the whole namespace
    assert len(kube.calls) <= 4  # the pod, its Deployment, that Deployment's pods (and a StatefulSet try)


def test_a_vanished_pod_of_no_readable_workload_gets_no_suggestions_and_no_namespace_list(kube):
    crowd(kube, 200, workloads=10)
    cluster = LiveCluster(KubeApi(kube.api_client(), retry=RetryPolicy(attempts=1)))
    kube.calls.clear()
    with pytest.raises(PodGone) as info:
        cluster.collect(NS, "nothing-like-it-abc12-xyz98")
    assert info.value.close_matches == [] and info.value.newest_of_workload is None
    assert pod_lists(kube) == []


def test_lists_are_read_page_by_page_and_miss_nothing(kube):
    crowd(kube, 1200, workloads=12)
    api = KubeApi(kube.api_client(), retry=RetryPolicy(attempts=1))
    api.page_size = 500
    kube.list_pages.clear()
    pods = api.list_pods(NS)
    assert len(pods) == 1200 and len({p["metadata"]["name"] for p in pods}) == 1200
    assert kube.list_pages == ["Pod"] * 3
    assert [c.query.get("limit") for c in pod_lists(kube)] == ["500"] * 3


def test_the_pod_watchs_initial_list_is_paginated(kube):
    crowd(kube, 240, workloads=6)
    api = KubeApi(kube.api_client(), retry=RetryPolicy(attempts=1, sleep=lambda s: None))
    api.page_size = 100
    work = WorkQueue(workers=1, queue_size=10)
    settings = WatchSettings(namespaces=(NS,), timeout_seconds=5, backoff_initial=0.02, backoff_max=0.2)
    kube.list_pages.clear()
    watch = PodWatch(api, work, lambda target: None, settings).start()
    try:
        deadline = time.monotonic() + bound(30)  # only bounds a failure
        while watch.stats.lists == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        first = pod_lists(kube)[:3]
        known = len(watch.state.pods)
    finally:
        watch.stop()
        work.shutdown()
    assert [c.query.get("limit") for c in first] == ["100"] * 3
    assert [c.query.get("continue") for c in first] == [None, "100", "200"]
    assert known == 240
