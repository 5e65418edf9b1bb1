"""What a resolved alert costs: the unresolved incidents of the namespace listed (incidents are
never deleted, so listing them all reads every one the namespace ever had), and exactly the
unresolved ones holding the alerted pod resolved."""

from __future__ import annotations

from fakes import FakeCluster, RecordingChat, kv_diagnosis
from test_repeat_cost import KEY, NS, CountingRedactor, CountingStore, pod_alert

from bot.app.service import OncallService, Policy


class ListingStore(CountingStore):
    """The counting store, recording the names each list returned."""

    def __init__(self, folder, redactor) -> None:
        super().__init__(folder, redactor)
        self.listed: list[list[str]] = []

    def list(self, state_not=None, **labels):
        found = super().list(state_not=state_not, **labels)
        self.listed.append([incident.name for incident in found])
        return found


def test_a_resolved_alert_reads_only_the_unresolved_and_resolves_exactly_the_pods_own(tmp_path):
    cluster = FakeCluster()
    for i in range(3):
        cluster.add_pod(NS, f"vllm-w{i:03d}-7d9f8c6b5-x2k4p", f"vllm-w{i:03d}")
    store = ListingStore(tmp_path, CountingRedactor())
    service = OncallService(cluster, store, RecordingChat(), Policy(seal_key=KEY), diagnose=kv_diagnosis)
    mine, other, done = (service.handle_alert(pod_alert(i)) for i in range(3))
    assert service.handle_alert(pod_alert(2).model_copy(update={"firing": False})).name == done.name
    versions = {name: store.get(name).version for name in (other.name, done.name)}
    resolved = service.handle_alert(pod_alert(0).model_copy(update={"firing": False}))
    assert resolved is not None and resolved.name == mine.name and store.get(mine.name).state == "resolved"
    assert sorted(store.listed[-1]) == sorted([mine.name, other.name])  # the resolved one not read
    assert {name: store.get(name).version for name in versions} == versions
    assert store.get(other.name).state == "proposed"
