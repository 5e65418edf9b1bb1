"""Where incidents live: a custom resource in the cluster, or a folder for the terminal.

The incident's name is derived from (cluster, namespace, workload, cause), so "create" is the
dedup step: whoever creates it first owns the post; everyone else updates it. Updates are
compare-and-swap (resourceVersion in the cluster, a version counter in the folder), which is
what makes a double click, two approvers or two bot replicas act exactly once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from bot.ports import Incident, IncidentConflict, IncidentExists

GROUP = "oncall.vllm.ai"
VERSION = "v1"
PLURAL = "vllmincidents"
KIND = "VLLMIncident"
LABEL_PREFIX = f"{GROUP}/"
NAME_LIMIT = 63  # a DNS-1123 label: also fits label values and every resource name


def _hash(text: str, length: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def _dns_label(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")


def incident_name(cluster: str, namespace: str, workload: str, cause: str | None) -> str:
    """Deterministic, DNS-1123 safe. A hash of the exact key keeps distinct keys distinct after
    sanitising ("a_b" vs "a-b") and lets a long key be shortened without colliding."""
    key = "\x1f".join([cluster, namespace, workload, cause or "unknown"])
    readable = _dns_label(f"{cluster}-{namespace}-{workload}-{cause or 'unknown'}")
    readable = readable[: NAME_LIMIT - 9].rstrip("-") or "incident"
    return f"{readable}-{_hash(key)}"


def label_value(text: str | None) -> str:
    """A valid label value (<= 63 chars of [A-Za-z0-9_.-], alphanumeric at both ends)."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "-", text or "none").strip("-_.")
    if len(value) > NAME_LIMIT:
        value = value[: NAME_LIMIT - 9].rstrip("-_.") + "-" + _hash(text or "")
    return value or "none"


def incident_labels(incident: Incident) -> dict[str, str]:
    """What `list(**labels)` can filter on, in both stores."""
    return {
        "cluster": label_value(incident.cluster),
        "namespace": label_value(incident.namespace),
        "workload": label_value(incident.workload),
        "cause": label_value(incident.cause),
        "state": incident.state,
        "posted": "true" if incident.slack_ts else "false",
    }


def _matches(incident: Incident, wanted: dict[str, str]) -> bool:
    have = incident_labels(incident)
    return all(have.get(key) == _selector_value(key, value) for key, value in wanted.items())


def _selector_value(key: str, value: str) -> str:
    return value if key in ("state", "posted") else label_value(value)


def change_summary(incident: Incident) -> str:
    """One line for `kubectl get vllmincidents`: the flags the proposal changes."""
    if not incident.proposal:
        return ""
    parts = [f"{c.name}: {c.before or '-'} -> {c.after or '-'}" for c in incident.proposal.changes]
    return "; ".join(parts)[:200]


# ---- folder ------------------------------------------------------------------------------


class FolderIncidentStore:
    """One JSON file per incident. Exclusive create (O_EXCL) and a version counter checked
    under an flock, so two processes sharing the folder behave like two replicas on the cluster."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
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
        stored = incident.model_copy(update={"version": "1"})
        path = self._path(incident.name)
        with self._locked(incident.name, exclusive=True):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                raise IncidentExists(incident.name) from None
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(stored.model_dump_json(indent=1))
                f.flush()
                os.fsync(f.fileno())
        return stored

    def get(self, name: str) -> Incident | None:
        path = self._path(name)
        if not path.exists():
            return None
        with self._locked(name, exclusive=False):
            return Incident.model_validate_json(path.read_text(encoding="utf-8"))

    def update(self, incident: Incident) -> Incident:
        path = self._path(incident.name)
        with self._locked(incident.name, exclusive=True):
            if not path.exists():
                raise IncidentConflict(f"{incident.name}: deleted")
            current = Incident.model_validate_json(path.read_text(encoding="utf-8"))
            if current.version != incident.version:
                raise IncidentConflict(f"{incident.name}: version {incident.version} is stale "
                                       f"(now {current.version})")
            stored = incident.model_copy(update={"version": str(int(current.version or 0) + 1)})
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{incident.name}.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(stored.model_dump_json(indent=1))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)  # readers see the old or the new file, never half of one
        return stored

    def list(self, **labels: str) -> list[Incident]:
        out = []
        for path in sorted(self.folder.glob("*.json")):
            incident = self.get(path.stem)
            if incident and _matches(incident, labels):
                out.append(incident)
        return out


# ---- Kubernetes custom resource ----------------------------------------------------------


def to_custom_object(incident: Incident) -> dict[str, Any]:
    """The VLLMIncident object. The top-level spec fields state/cause/approver/change are what
    `kubectl get vllmincidents` prints; `record` is the full incident."""
    record = incident.model_dump(mode="json", exclude={"name", "version"})
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
    record = json.loads((obj.get("spec") or {})["record"])
    return Incident.model_validate({**record, "name": meta["name"], "version": meta.get("resourceVersion")})


class KubeIncidentStore:
    """Incidents as vllmincidents.oncall.vllm.ai/v1 objects in one namespace.

    create -> 409 AlreadyExists -> IncidentExists. update is a merge patch carrying
    metadata.resourceVersion, which the API server treats as a precondition: 409 Conflict when
    someone else wrote in between -> IncidentConflict.

    The record is kept as one JSON string in spec.record: it round-trips exactly (no schema
    pruning of nested fields) and a merge patch replaces it whole, so no stale key survives.
    """

    def __init__(self, api: Any, namespace: str):
        # bot.kube.api.KubeApi: 429/5xx/timeouts retried and counted, 403 named. A retried create
        # or update that had in fact succeeded comes back as 409, which callers already handle as
        # "someone else got there first" and re-read.
        self.api = api
        self.namespace = namespace

    @classmethod
    def from_environment(cls, namespace: str, context: str | None = None) -> "KubeIncidentStore":
        from bot.kube.api import KubeApi, api_client_from_environment

        return cls(KubeApi(api_client_from_environment(context)), namespace)

    def create(self, incident: Incident) -> Incident:
        from kubernetes.client.exceptions import ApiException

        try:
            obj = self.api.create_custom(GROUP, VERSION, self.namespace, PLURAL, to_custom_object(incident))
        except ApiException as exc:
            if exc.status == 409:
                raise IncidentExists(incident.name) from None
            raise
        return from_custom_object(obj)

    def get(self, name: str) -> Incident | None:
        from kubernetes.client.exceptions import ApiException

        try:
            obj = self.api.get_custom(GROUP, VERSION, self.namespace, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return from_custom_object(obj)

    def update(self, incident: Incident) -> Incident:
        from kubernetes.client.exceptions import ApiException

        if not incident.version:
            raise IncidentConflict(f"{incident.name}: no resourceVersion to compare against")
        body = to_custom_object(incident)
        patch = {"metadata": {"resourceVersion": incident.version, "labels": body["metadata"]["labels"]},
                 "spec": body["spec"]}
        try:
            obj = self.api.patch_custom(GROUP, VERSION, self.namespace, PLURAL, incident.name, patch)
        except ApiException as exc:
            if exc.status in (404, 409):
                raise IncidentConflict(f"{incident.name}: {exc.reason}") from None
            raise
        return from_custom_object(obj)

    def list(self, **labels: str) -> list[Incident]:
        selector = ",".join(f"{LABEL_PREFIX}{k}={_selector_value(k, v)}" for k, v in labels.items())
        items = self.api.list_custom(GROUP, VERSION, self.namespace, PLURAL, label_selector=selector or None)
        return [from_custom_object(item) for item in items]
