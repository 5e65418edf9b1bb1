"""A repeat's message update folded while another is sent (bot.app.messages.refresh_folded): the
incident is read again when its turn comes; unchanged since the repeat wrote it (the same
version), the repeat's own copy is shown, whose seal is known; changed (another replica wrote),
the stored one is shown."""

from __future__ import annotations

from fakes import RecordingChat
from test_repeat_cost import KEY, pod_alert, service_with_workloads

from bot.app.messages import Messages
from bot.app.metrics import Metrics
from bot.app.seal import Sealer


class FoldingChat(RecordingChat):
    """Records the incidents it shows; while the first update is sent, another repeat folds in."""

    def __init__(self) -> None:
        super().__init__()
        self.shown: list = []
        self.meanwhile = None

    def update_incident(self, incident, message):
        self.shown.append(incident)
        super().update_incident(incident, message)
        if self.meanwhile is not None:
            meanwhile, self.meanwhile = self.meanwhile, None
            meanwhile()


def folded(tmp_path, written_meanwhile: bool):
    service, store, redactor, _ = service_with_workloads(tmp_path, 2)
    first, second = (service.handle_alert(pod_alert(i)) for i in range(2))
    chat = FoldingChat()
    messages = Messages(chat, Metrics(), Sealer(KEY, redactor).intact)
    known = store.get(second.name)
    if written_meanwhile:  # another replica counts the same crash after this repeat's write
        store.update(known.revised(alert_count=known.alert_count + 1))
    chat.meanwhile = lambda: messages.refresh_folded(second.name, lambda: store.get(second.name), known)
    messages.refresh_folded(first.name, lambda: store.get(first.name), store.get(first.name))
    return chat, known, store.get(second.name)


def test_a_folded_update_unchanged_since_its_write_shows_the_repeats_own_copy(tmp_path):
    chat, known, stored = folded(tmp_path, written_meanwhile=False)
    assert len(chat.shown) == 2 and chat.shown[1] is known and stored.version == known.version


def test_a_folded_update_written_since_shows_the_stored_incident(tmp_path):
    chat, known, stored = folded(tmp_path, written_meanwhile=True)
    assert len(chat.shown) == 2 and chat.shown[1] is not known
    assert chat.shown[1].alert_count == known.alert_count + 1 == stored.alert_count
