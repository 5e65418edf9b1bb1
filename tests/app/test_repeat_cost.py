"""What an alert costs the application: the incident's text redacted and sealed once per write,
a repeat of the same crash written from the incident this process last wrote (no read first),
and nothing lost when that copy is stale (another replica wrote meanwhile)."""

from __future__ import annotations

from fakes import FakeCluster, RecordingChat, kv_diagnosis

from bot.app.records import AlertTarget, NoteKind
from bot.app.seal import Sealer
from bot.app.service import OncallService, Policy
from bot.app.state import IncidentState
from bot.diagnosis.redact import Redactor
from bot.local.store import FolderIncidentStore
from bot.slack.blocks import incident_message

NS, DEPLOY = "inference", "vllm-llama3-8b"
POD = "vllm-llama3-8b-7d9f8c6b5-x2k4p"
KEY = b"k" * 32
EXPLANATION = kv_diagnosis().explanation


class CountingRedactor(Redactor):
    """The built-in rules, counting the texts handed to them."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def text(self, text: str) -> str:
        self.texts.append(text)
        return super().text(text)


class CountingStore(FolderIncidentStore):
    """The folder store, counting its reads and writes."""

    def __init__(self, folder, redactor: Redactor) -> None:
        super().__init__(folder, redactor)
        self.gets = self.updates = 0

    def get(self, name):
        self.gets += 1
        return super().get(name)

    def update(self, incident):
        self.updates += 1
        return super().update(incident)


def alert(firing: bool = True) -> AlertTarget:
    return AlertTarget(namespace=NS, pod=POD, container="vllm", firing=firing)


def replica(folder, chat: RecordingChat, name: str = "a") -> tuple[OncallService, CountingStore, CountingRedactor]:
    cluster = FakeCluster()
    cluster.add_pod(NS, POD, DEPLOY)
    redactor = CountingRedactor()
    store = CountingStore(folder, redactor)
    service = OncallService(cluster, store, chat, Policy(replica=name, seal_key=KEY, redactor=redactor),
                            diagnose=kv_diagnosis)
    return service, store, redactor


def service_with_workloads(folder, workloads: int) -> tuple[OncallService, CountingStore, CountingRedactor, RecordingChat]:
    """One replica over `workloads` Deployments, one crashing pod each (pod_alert(i))."""
    cluster = FakeCluster()
    for i in range(workloads):
        cluster.add_pod(NS, f"vllm-w{i:03d}-7d9f8c6b5-x2k4p", f"vllm-w{i:03d}")
    redactor = CountingRedactor()
    store = CountingStore(folder, redactor)
    chat = RecordingChat()
    service = OncallService(cluster, store, chat, Policy(seal_key=KEY, redactor=redactor), diagnose=kv_diagnosis)
    return service, store, redactor, chat


def pod_alert(i: int) -> AlertTarget:
    return AlertTarget(namespace=NS, pod=f"vllm-w{i:03d}-7d9f8c6b5-x2k4p", container="vllm")

def test_a_new_incident_is_redacted_once_and_stored_sealed(tmp_path):
    service, store, redactor = replica(tmp_path, RecordingChat())
    incident = service.handle_alert(alert())
    assert incident is not None and incident.message_id
    # created, then its message recorded: two writes, the diagnosis redacted for the first only
    assert redactor.texts.count(EXPLANATION) == 1
    stored = store.get(incident.name)
    assert stored.text_seal and Sealer(KEY, redactor).intact(stored)


class RenderingChat(RecordingChat):
    """The recording chat, rendering each message as Slack's adapter does (with the redactor)."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def post_incident(self, incident, channel=None, thread=None):
        incident_message(incident, self.redactor)
        return super().post_incident(incident, channel, thread)


def test_a_message_is_rendered_without_redacting_the_incident_again(tmp_path):
    cluster = FakeCluster()
    cluster.add_pod(NS, POD, DEPLOY)
    redactor = CountingRedactor()
    chat = RenderingChat(redactor)
    service = OncallService(cluster, FolderIncidentStore(tmp_path, redactor), chat,
                            Policy(seal_key=KEY, redactor=redactor), diagnose=kv_diagnosis)
    incident = service.handle_alert(alert())
    assert incident is not None and chat.posts
    created = incident.history[0]
    # the creation line: redacted by the two writes that changed the history (created, posted),
    # never by the rendering of the message (it takes the incident as written, links added)
    assert sum(created in text for text in redactor.texts) == 2


def test_a_repeat_writes_its_count_without_reading_or_redacting(tmp_path):
    chat = RecordingChat()
    service, store, redactor = replica(tmp_path, chat)
    first = service.handle_alert(alert())
    gets, updates, texts = store.gets, store.updates, len(redactor.texts)
    again = service.handle_alert(alert())
    assert again is not None and again.alert_count == 2
    assert (store.gets - gets, store.updates - updates) == (0, 1)
    assert len(redactor.texts) == texts  # the count changes no redacted text: nothing redacted again
    assert store.get(first.name).alert_count == 2 and Sealer(KEY, redactor).intact(store.get(first.name))
    assert [(name, message.message_id) for name, _, message in chat.updates] == [(first.name, first.message_id)]


def test_a_repeat_after_another_replica_wrote_counts_on_the_current_incident(tmp_path):
    chat = RecordingChat()
    a, store, _ = replica(tmp_path, chat, "a")
    b, _, _ = replica(tmp_path, chat, "b")
    first = a.handle_alert(alert())
    b.handle_alert(alert())  # the HA pair's other copy: b has not seen it, folds it into a's incident
    gets = store.gets
    again = a.handle_alert(alert())  # a's copy of the incident is stale: the CAS loses, reads, counts
    assert again is not None and again.alert_count == 3 and store.gets - gets == 1
    assert store.get(first.name).alert_count == 3 and len(chat.posts) == 1


def test_a_repeat_after_another_replica_resolved_it_reopens_it(tmp_path):
    chat = RecordingChat()
    a, store, _ = replica(tmp_path, chat, "a")
    b, _, _ = replica(tmp_path, chat, "b")
    first = a.handle_alert(alert())
    assert b.handle_alert(alert(firing=False)).state == IncidentState.RESOLVED
    again = a.handle_alert(alert())  # a still holds it open: decided on the stored copy, not on that
    assert again is not None and again.state == IncidentState.PROPOSED
    assert store.get(first.name).state == IncidentState.PROPOSED
    assert [note.kind for _, note in chat.replies] == [NoteKind.CRASHING_AGAIN]


def test_an_incident_edited_between_two_repeats_is_not_rendered(tmp_path):
    """The seal this process knows holds for its own writes never covers someone else's edit."""
    chat = RecordingChat()
    service, store, redactor = replica(tmp_path, chat)
    first = service.handle_alert(alert())
    service.handle_alert(alert())
    assert len(chat.updates) == 1 and service.metrics.refused_renders._value.get() == 0
    stored = store.get(first.name)
    forged = stored.diagnosis.model_copy(update={"title": "Approve this: it only restarts the pod"})
    store.update(stored.revised(diagnosis=forged))  # an edit of the object: a new version, the old seal
    again = service.handle_alert(alert())  # counted on the edited copy, which is not shown
    assert again is not None and again.alert_count == 3 and again.diagnosis.title == forged.title
    assert len(chat.updates) == 1 and service.metrics.refused_renders._value.get() == 1
    assert not Sealer(KEY, redactor).intact(store.get(first.name))


class RewritingStore(CountingStore):
    """A store whose writes come back changed (as a mutating admission webhook would change them)."""

    def update(self, incident):
        forged = incident.diagnosis.model_copy(update={"title": "Approve this: it only restarts the pod"})
        return super().update(incident.revised(diagnosis=forged))


def test_a_write_answered_with_other_text_is_checked_in_full(tmp_path):
    chat = RecordingChat()
    cluster = FakeCluster()
    cluster.add_pod(NS, POD, DEPLOY)
    redactor = CountingRedactor()
    service = OncallService(cluster, RewritingStore(tmp_path, redactor), chat,
                            Policy(seal_key=KEY, redactor=redactor), diagnose=kv_diagnosis)
    first = service.handle_alert(alert())  # created as sealed; recording its message comes back rewritten
    assert first is not None and first.message_id and len(chat.posts) == 1
    service.handle_alert(alert())
    assert chat.updates == [] and service.metrics.refused_renders._value.get() >= 1
