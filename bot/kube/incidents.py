"""Incidents as VLLMIncident custom resources in the cluster (shared by bot replicas)."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from bot.app.incidents import (
    GROUP,
    KIND,
    LABEL_PREFIX,
    PLURAL,
    VERSION,
    change_summary,
    incident_labels,
    selector_value,
)
from bot.app.ports import IncidentConflict, IncidentExists
from bot.app.records import Incident
from bot.app.redaction import marked_as_stored, redacted_incident
from bot.diagnosis.redact import DEFAULT, Redactor
from bot.kube.errors import KubeConflict, KubeNotFound

# The record's keys for the incident's message, as every earlier version wrote them. Kept, so the
# objects already in a cluster, and the replicas of an older version during a rolling upgrade,
# read the same record (an older replica that missed the message would post it again).
STORED_KEYS = {"chat_channel": "slack_channel", "message_id": "slack_ts"}
READ_KEYS = {stored: key for key, stored in STORED_KEYS.items()}


def to_record(incident: Incident) -> dict[str, Any]:
    record = incident.model_dump(mode="json", exclude={"name", "version"})
    return {STORED_KEYS.get(key, key): value for key, value in record.items()}


def from_record(record: dict[str, Any]) -> dict[str, Any]:
    return {READ_KEYS.get(key, key): value for key, value in record.items()}


def to_custom_object(incident: Incident, redactor: Redactor = DEFAULT) -> dict[str, Any]:
    """The VLLMIncident object. The top-level spec fields state/cause/approver/change are what
    `kubectl get vllmincidents` prints; `record` is the full incident, redacted (see
    bot.app.redaction: secrets never go into the object, the apply path re-derives them)."""
    return written_for(incident, redactor).obj


class Written(NamedTuple):
    """What a write sends: the VLLMIncident object, and its spec.record before JSON encoding."""

    obj: dict[str, Any]
    record: dict[str, Any]


def written_for(incident: Incident, redactor: Redactor = DEFAULT) -> Written:
    """What a write of `incident` sends (to_custom_object), with the record it encodes."""
    incident = redacted_incident(incident, redactor)
    record = to_record(incident)
    return Written({
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": incident.name,
            "labels": {LABEL_PREFIX + k: v for k, v in incident_labels(incident).items()},
        },
        "spec": {
            "cluster": incident.cluster,
            "namespace": incident.namespace,
            "workload": incident.workload,
            "cause": incident.cause or "unknown",
            "state": incident.state,
            "approver": incident.approver or "",
            "change": change_summary(incident),
            "record": json.dumps(record, separators=(",", ":")),
        },
    }, record)


def from_custom_object(obj: dict[str, Any], written: Written | None = None) -> Incident:
    """The incident in a VLLMIncident object. `written`: the object this bot just sent, with its
    record before encoding (written_for); when the server's answer carries that same record, parsing
    it would give that record back (it holds JSON types only: model_dump(mode="json")), so it is
    not parsed again. It is validated all the same: what is read is typed as any read."""
    meta = obj.get("metadata") or {}
    stored = (obj.get("spec") or {})["record"]
    record = written.record if written is not None and stored == written.obj["spec"]["record"] else json.loads(stored)
    fields = from_record(record)
    fields["name"], fields["version"] = meta["name"], meta.get("resourceVersion")
    return Incident.model_validate(fields)


class KubeIncidentStore:
    """Incidents as vllmincidents.oncall.vllm.ai/v1 objects in one namespace.

    create -> 409 AlreadyExists (KubeConflict) -> IncidentExists. update is a merge patch carrying
    metadata.resourceVersion, which the API server treats as a precondition: 409 Conflict when
    someone else wrote in between (or 404, deleted) -> IncidentConflict.

    The record is kept as one JSON string in spec.record: it round-trips exactly (no schema
    pruning of nested fields) and a merge patch replaces it whole, so no stale key survives.
    """

    def __init__(self, api: Any, namespace: str, redactor: Redactor = DEFAULT):
        # bot.kube.api.KubeApi: 429/5xx/timeouts retried and counted, 403 named. A retried create
        # or update that had in fact succeeded comes back as 409, which callers already handle as
        # "someone else got there first" and re-read.
        self.api = api
        self.namespace = namespace
        self.redactor = redactor

    @classmethod
    def from_environment(cls, namespace: str, context: str | None = None) -> KubeIncidentStore:
        from bot.kube.api import KubeApi, api_client_from_environment

        return cls(KubeApi(api_client_from_environment(context)), namespace)

    def _read(self, obj: dict[str, Any], written: Written | None = None) -> Incident:
        """The incident as this store wrote it: redacted by its redactor, so marked as such.
        `written`: what the write that answered `obj` sent (from_custom_object)."""
        return marked_as_stored(from_custom_object(obj, written), self.redactor)

    def create(self, incident: Incident) -> Incident:
        written = written_for(incident, self.redactor)
        try:
            obj = self.api.create_custom(GROUP, VERSION, self.namespace, PLURAL, written.obj)
        except KubeConflict:  # 409 AlreadyExists
            raise IncidentExists(incident.name) from None
        return self._read(obj, written)

    def get(self, name: str) -> Incident | None:
        try:
            obj = self.api.get_custom(GROUP, VERSION, self.namespace, PLURAL, name)
        except KubeNotFound:
            return None
        return self._read(obj)

    def update(self, incident: Incident) -> Incident:
        if not incident.version:
            raise IncidentConflict(f"{incident.name}: no resourceVersion to compare against")
        written = written_for(incident, self.redactor)
        patch = {"metadata": {"resourceVersion": incident.version, "labels": written.obj["metadata"]["labels"]},
                 "spec": written.obj["spec"]}
        try:
            obj = self.api.patch_custom(GROUP, VERSION, self.namespace, PLURAL, incident.name, patch)
        except (KubeNotFound, KubeConflict) as exc:
            raise IncidentConflict(f"{incident.name}: {exc.reason}") from None
        return self._read(obj, written)

    def list(self, **labels: str) -> list[Incident]:
        selector = ",".join(f"{LABEL_PREFIX}{k}={selector_value(k, v)}" for k, v in labels.items())
        items = self.api.list_custom(GROUP, VERSION, self.namespace, PLURAL, label_selector=selector or None)
        return [self._read(item) for item in items]
