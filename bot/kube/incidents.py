"""Incidents as VLLMIncident custom resources in the cluster (shared by bot replicas)."""

from __future__ import annotations

import json
from typing import Any

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
    incident = redacted_incident(incident, redactor)
    record = to_record(incident)
    return {
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
    }


def from_custom_object(obj: dict[str, Any]) -> Incident:
    meta = obj.get("metadata") or {}
    record = from_record(json.loads((obj.get("spec") or {})["record"]))
    return Incident.model_validate({**record, "name": meta["name"], "version": meta.get("resourceVersion")})


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

    def _read(self, obj: dict[str, Any]) -> Incident:
        """The incident as this store wrote it: redacted by its redactor, so marked as such."""
        return marked_as_stored(from_custom_object(obj), self.redactor)

    def create(self, incident: Incident) -> Incident:
        try:
            obj = self.api.create_custom(GROUP, VERSION, self.namespace, PLURAL, to_custom_object(incident, self.redactor))
        except KubeConflict:  # 409 AlreadyExists
            raise IncidentExists(incident.name) from None
        return self._read(obj)

    def get(self, name: str) -> Incident | None:
        try:
            obj = self.api.get_custom(GROUP, VERSION, self.namespace, PLURAL, name)
        except KubeNotFound:
            return None
        return self._read(obj)

    def update(self, incident: Incident) -> Incident:
        if not incident.version:
            raise IncidentConflict(f"{incident.name}: no resourceVersion to compare against")
        body = to_custom_object(incident, self.redactor)
        patch = {"metadata": {"resourceVersion": incident.version, "labels": body["metadata"]["labels"]},
                 "spec": body["spec"]}
        try:
            obj = self.api.patch_custom(GROUP, VERSION, self.namespace, PLURAL, incident.name, patch)
        except (KubeNotFound, KubeConflict) as exc:
            raise IncidentConflict(f"{incident.name}: {exc.reason}") from None
        return self._read(obj)

    def list(self, state_not: str | None = None, **labels: str) -> list[Incident]:
        wanted = [f"{LABEL_PREFIX}{k}={selector_value(k, v)}" for k, v in labels.items()]
        if state_not is not None:  # served by the API server: the others are never sent or parsed
            wanted.append(f"{LABEL_PREFIX}state!={selector_value('state', state_not)}")
        selector = ",".join(wanted)
        items = self.api.list_custom(GROUP, VERSION, self.namespace, PLURAL, label_selector=selector or None)
        return [self._read(item) for item in items]
