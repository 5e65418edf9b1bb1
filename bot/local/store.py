"""Incidents as one JSON file each, in a folder: the store for the terminal and the demo."""

from __future__ import annotations

import fcntl
import json
import os
import re
import tempfile
from pathlib import Path

from bot.app.incidents import matches
from bot.app.ports import IncidentConflict, IncidentExists
from bot.app.records import Incident
from bot.app.redaction import marked_as_stored, redacted_incident
from bot.diagnosis.redact import DEFAULT, Redactor

# The file's keys for the incident's message, as every earlier version wrote them (as in the
# cluster's objects, bot/kube/incidents.py): two processes of different versions sharing the
# folder read the same file.
_STORED_KEYS = {"chat_channel": "slack_channel", "message_id": "slack_ts"}
_FIELDS = {stored: field for field, stored in _STORED_KEYS.items()}


def _read(path: Path) -> Incident:
    record = json.loads(path.read_text(encoding="utf-8"))
    return Incident.model_validate({_FIELDS.get(key, key): value for key, value in record.items()})


def _text(incident: Incident) -> str:
    record = incident.model_dump(mode="json")
    return json.dumps({_STORED_KEYS.get(key, key): value for key, value in record.items()}, indent=1,
                      ensure_ascii=False)


class FolderIncidentStore:
    """One JSON file per incident. Exclusive create (O_EXCL) and a version counter checked
    under an flock, so two processes sharing the folder behave like two replicas on the cluster.
    What is written is redacted (bot.app.redaction), as in the cluster's incident objects."""

    def __init__(self, folder: str | Path, redactor: Redactor = DEFAULT):
        self.folder = Path(folder)
        self.redactor = redactor
        self.folder.mkdir(parents=True, exist_ok=True)

    def _path(self, name: str) -> Path:
        if not re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", name):
            raise ValueError(f"not an incident name: {name!r}")
        return self.folder / f"{name}.json"

    def _locked(self, name: str, exclusive: bool):
        lock = open(self.folder / f".{name}.lock", "a+")
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        return lock  # closing the file releases the lock

    def create(self, incident: Incident) -> Incident:
        stored = redacted_incident(incident, self.redactor).with_version("1")
        path = self._path(incident.name)
        with self._locked(incident.name, exclusive=True):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                raise IncidentExists(incident.name) from None
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(_text(stored))
                f.flush()
                os.fsync(f.fileno())
        return marked_as_stored(stored, self.redactor)

    def get(self, name: str) -> Incident | None:
        path = self._path(name)
        if not path.exists():
            return None
        with self._locked(name, exclusive=False):
            return marked_as_stored(_read(path), self.redactor)

    def update(self, incident: Incident) -> Incident:
        path = self._path(incident.name)
        with self._locked(incident.name, exclusive=True):
            if not path.exists():
                raise IncidentConflict(f"{incident.name}: deleted")
            current = _read(path)
            if current.version != incident.version:
                raise IncidentConflict(f"{incident.name}: version {incident.version} is stale "
                                       f"(now {current.version})")
            stored = redacted_incident(incident, self.redactor).with_version(str(int(current.version or 0) + 1))
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{incident.name}.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(_text(stored))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)  # readers see the old or the new file, never half of one
        return marked_as_stored(stored, self.redactor)

    def list(self, state_not: str | None = None, **labels: str) -> list[Incident]:
        out = []
        for path in sorted(self.folder.glob("*.json")):
            incident = self.get(path.stem)
            if incident and matches(incident, labels) and (state_not is None or incident.state != state_not):
                out.append(incident)
        return out
