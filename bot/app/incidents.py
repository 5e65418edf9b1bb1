"""Incident names and labels, shared by every incident store (pure).

The incident's name is derived from (cluster, namespace, workload, cause), so "create" is the
dedup step: whoever creates it first owns the post; everyone else updates it. Updates are
compare-and-swap (resourceVersion in the cluster, a version counter in the folder), which is
what makes a double click, two approvers or two bot replicas act exactly once.
"""

from __future__ import annotations

import hashlib
import re

from bot.app.records import Incident

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
        "state": str(incident.state),  # the plain value (a StrEnum formats as it too)
        "posted": "true" if incident.message_id else "false",
    }


def matches(incident: Incident, wanted: dict[str, str]) -> bool:
    have = incident_labels(incident)
    return all(have.get(key) == selector_value(key, value) for key, value in wanted.items())


def selector_value(key: str, value: str) -> str:
    return value if key in ("state", "posted") else label_value(value)


def change_summary(incident: Incident) -> str:
    """One line for `kubectl get vllmincidents`: the flags the proposal changes."""
    if not incident.proposal:
        return ""
    parts = [f"{c.name}: {c.before or '-'} -> {c.after or '-'}" for c in incident.proposal.changes]
    return "; ".join(parts)[:200]
