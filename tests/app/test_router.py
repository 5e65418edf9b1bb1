"""ClusterRouter: which cluster's service a request belongs to (ports faked, the services real)."""

from __future__ import annotations

import pytest
from fakes import FakeCluster, RecordingChat, kv_diagnosis

from bot.app.errors import ClusterUnavailable
from bot.app.metrics import Metrics
from bot.app.records import AlertTarget
from bot.app.router import ClusterRouter, UnknownCluster
from bot.app.service import OncallService, Policy
from bot.local.store import FolderIncidentStore

NS, DEPLOY, POD = "inference", "vllm", "vllm-7d9f8c6b5-x2k4p"


class FlakyStore(FolderIncidentStore):
    """A store whose cluster can stop answering (its API server is down)."""

    down = False

    def get(self, name):
        if self.down:
            raise ConnectionError("the API server does not answer")
        return super().get(name)

    def list(self, **labels):
        if self.down:
            raise ConnectionError("the API server does not answer")
        return super().list(**labels)


def service(name: str, folder, chat, metrics) -> OncallService:
    cluster = FakeCluster(name)
    cluster.add_pod(NS, POD, DEPLOY)
    return OncallService(cluster, FlakyStore(folder / name), chat, Policy(approver_users=frozenset({"U0A"})),
                         metrics, diagnose=kv_diagnosis)


@pytest.fixture
def router(tmp_path):
    chat, metrics = RecordingChat(), Metrics()
    return ClusterRouter([service("prod-eu", tmp_path, chat, metrics), service("prod", tmp_path, chat, metrics)],
                         default="prod")


def test_an_incident_is_found_in_the_cluster_whose_store_holds_it(router):
    eu = router.for_cluster("prod-eu").handle_alert(AlertTarget(namespace=NS, pod=POD, container="vllm"))
    plain = router.for_cluster("prod").handle_alert(AlertTarget(namespace=NS, pod=POD, container="vllm"))
    # "prod-eu-..." also begins with "prod-": the name is only a hint, the store decides
    assert eu.name.startswith("prod-eu-") and plain.name.startswith("prod-")
    assert router.for_incident(eu.name) is router.services["prod-eu"]
    assert router.for_incident(plain.name) is router.services["prod"]
    assert router.for_incident("prod-inference-vllm-gone-12345678") is None


def test_a_cluster_that_cannot_be_asked_is_said_so_instead_of_not_found(router):
    plain = router.for_cluster("prod").handle_alert(AlertTarget(namespace=NS, pod=POD, container="vllm"))
    router.services["prod-eu"].store.down = True
    assert router.for_incident(plain.name) is router.services["prod"]  # found elsewhere: fine
    with pytest.raises(ClusterUnavailable, match="cluster prod-eu could not be asked"):
        router.for_incident("prod-eu-inference-vllm-oom-12345678")


def test_alerts_and_why_pick_the_named_cluster_or_the_default(router):
    assert router.names == ("prod", "prod-eu")
    assert router.for_alert(None) is router.default is router.services["prod"]
    assert router.for_alert("prod-eu") is router.services["prod-eu"]
    with pytest.raises(UnknownCluster, match="does not serve cluster gamma \\(it serves prod, prod-eu\\)"):
        router.for_alert("gamma")
    routed = router.handle_alert(AlertTarget(namespace=NS, pod=POD, container="vllm", cluster="prod-eu"))
    assert routed is not None and routed.cluster == "prod-eu"
    assert router.services["prod"].store.list() == []


def test_one_cluster_takes_every_request_as_before(tmp_path):
    only = service("solo", tmp_path, RecordingChat(), Metrics())
    router = ClusterRouter.of(only)
    assert ClusterRouter.of(router) is router and router.names == ("solo",)
    assert router.for_alert("anything") is only and router.for_alert(None) is only  # labels never refuse
    only.store.down = True
    assert router.for_incident("whatever") is only  # its store is not asked: the service answers as it did


def test_the_sweep_runs_in_every_cluster_even_when_one_fails(router):
    chat: RecordingChat = router.default.chat
    eu = router.services["prod-eu"]
    chat.down = True  # prod-eu's incident is opened but its post fails
    opened = eu.handle_alert(AlertTarget(namespace=NS, pod=POD, container="vllm"))
    assert opened is not None and not opened.message_id and chat.posts == []
    chat.down = False
    router.services["prod"].store.down = True  # the default cluster's sweep fails at once
    router.sweep()  # must not raise, and must still sweep prod-eu
    assert chat.posts == [(opened.name, "C0ALERTS")] and eu.store.get(opened.name).message_id


def test_a_router_refuses_an_empty_or_twice_served_or_unknown_default(tmp_path):
    chat, metrics = RecordingChat(), Metrics()
    with pytest.raises(ValueError, match="at least one"):
        ClusterRouter([])
    with pytest.raises(ValueError, match="served twice"):
        ClusterRouter([service("a", tmp_path, chat, metrics), service("a", tmp_path / "x", chat, metrics)])
    with pytest.raises(ValueError, match="default cluster b"):
        ClusterRouter([service("a", tmp_path, chat, metrics)], default="b")
