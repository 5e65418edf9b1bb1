"""Port-level fakes, in one place: a ClusterPort and a ChatPort that record what they were asked.

FakeCluster: a ClusterPort stand-in for the use-case and Slack-side tests (the port boundary, not HTTP).

Pods are served from one evidence bundle with the pod name swapped in; what apply/verify
answer is set per test. The end-to-end tests use the real Kubernetes side instead.
"""

from __future__ import annotations

import difflib
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bot.app.ports import ChatUnavailable, PodNotFound
from bot.app.records import ApplyResult, MessageRef, Note, Verification
from bot.diagnosis.evidence import load_bundle
from bot.diagnosis.models import Change, DiagnosisResult, Evidence
from bot.remedy.models import Proposal, WorkloadRef
from bot.slack.notes import note_text

BUNDLE = Path(__file__).resolve().parents[1] / "examples" / "incident" / "bundle"


class FakeCluster:
    def __init__(self, name: str = "test-cluster", bundle: Path = BUNDLE):
        self.name = name
        self.bundle = bundle
        self.pods: dict[tuple[str, str], str] = {}  # (namespace, pod) -> workload
        self.blocked: str | None = None  # live_patch_blocked reason for every workload
        self.apply_results: list[ApplyResult] = []  # answers for apply(), in order; default ok
        self.verification = Verification(outcome="ready", pod="new-pod", message="Ready after 95 s",
                                         kv_cache_line="GPU KV cache size: 18,432 tokens",
                                         concurrency_line="Maximum concurrency for 18,432 tokens per request: 1.00x")
        self.applied: list[tuple[str, str]] = []  # (proposal id, actor)
        self.landed: set[str] = set()  # proposal ids whose apply succeeded (what the workload's audit record says)
        self.rolled_back: list[tuple[str, str]] = []
        self.collected = 0
        self._lock = threading.Lock()

    def add_pod(self, namespace: str, pod: str, workload: str) -> None:
        self.pods[(namespace, pod)] = workload

    def resolve_pod(self, namespace: str, name: str) -> str:
        if (namespace, name) in self.pods:
            return name
        owned = sorted(p for (ns, p), w in self.pods.items() if ns == namespace and w == name)
        if owned:
            return owned[-1]
        names = [p for (ns, p) in self.pods if ns == namespace] + sorted(set(self.pods.values()))
        raise PodNotFound(namespace, name, difflib.get_close_matches(name, names, n=5, cutoff=0.4))

    def read_pod(self, namespace: str, pod: str) -> dict:
        if (namespace, pod) not in self.pods:
            raise PodNotFound(namespace, pod)
        doc = dict(load_bundle(self.bundle).pod or {})
        doc["metadata"] = {**doc.get("metadata", {}), "name": pod, "namespace": namespace}
        return doc

    def collect(self, namespace: str, pod: str, container: str | None = None) -> Evidence:
        if (namespace, pod) not in self.pods:
            raise PodNotFound(namespace, pod)
        with self._lock:
            self.collected += 1
        evidence = load_bundle(self.bundle)
        doc = dict(evidence.pod or {})
        doc["metadata"] = {**doc.get("metadata", {}), "name": pod, "namespace": namespace}
        return evidence.model_copy(update={"pod": doc, "source": f"{namespace}/{pod}", "container": container})

    def workload_for(self, evidence: Evidence) -> WorkloadRef:
        meta = (evidence.pod or {})["metadata"]
        return WorkloadRef(kind="Deployment", namespace=meta["namespace"],
                           name=self.pods[(meta["namespace"], meta["name"])], container="vllm",
                           resource_version="100", live_patch_blocked=self.blocked,
                           managed_by="argocd" if self.blocked else None,
                           repository_hint="values.yaml: servingEngineSpec.modelSpec[0].vllmConfig.maxModelLen: 18432"
                           if self.blocked else None)

    def propose(self, diagnosis: DiagnosisResult, evidence: Evidence, workload: WorkloadRef) -> Proposal | None:
        if not diagnosis.changes:
            return None
        now = datetime.now(UTC)
        return Proposal(id=f"p-{workload.name}-{diagnosis.cause}", cluster=self.name, workload=workload,
                        cause=diagnosis.cause or "", title=diagnosis.title, changes=diagnosis.changes,
                        command_before=diagnosis.command_before, command_after=diagnosis.command_after,
                        json_patch=[{"op": "test", "path": "/metadata/resourceVersion", "value": "100"}],
                        dry_run_ok=True, manifest_diff="-        - \"32768\"\n+        - \"18432\"" if self.blocked else None,
                        created_at=now, expires_at=now + timedelta(hours=1))

    def apply(self, proposal: Proposal, actor: str) -> ApplyResult:
        with self._lock:
            self.applied.append((proposal.id, actor))
            result = self.apply_results.pop(0) if self.apply_results else None
            if result is None or result.ok:
                self.landed.add(proposal.id)
        return result or ApplyResult(ok=True, message="Deployment inference/x patched (generation 4)",
                                     workload=proposal.workload)

    def was_applied(self, proposal: Proposal) -> ApplyResult | None:
        with self._lock:
            done = proposal.id in self.landed
        return ApplyResult(ok=True, message="already applied", workload=proposal.workload) if done else None

    def rollback(self, namespace: str, workload_kind: str, workload_name: str, actor: str,
                 change: object = None) -> ApplyResult:
        with self._lock:
            self.rolled_back.append((workload_name, actor))
            self.landed.clear()  # the audit record of the change is marked rolled back
        return ApplyResult(ok=True, message="previous command line restored")

    def verify(self, workload: WorkloadRef, timeout_seconds: float, diagnose: object = None) -> Verification:
        return self.verification


def kv_diagnosis(evidence: Evidence | None = None, max_model_len: str = "18432") -> DiagnosisResult:
    """A hand-built diagnosis of the bundled incident, independent of the diagnosis core."""
    before = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "32768"]
    return DiagnosisResult(
        cause="kv-cache-max-model-len", title="The KV cache cannot hold one request of --max-model-len tokens",
        explanation="32768 tokens x 128 KiB = 4.00 GiB needed, 2.34 GiB available.",
        evidence=["Available KV cache memory: 2.34 GiB"],
        changes=[Change(kind="flag", name="--max-model-len", before="32768", after=max_model_len)],
        command_before=before, command_after=before[:-1] + [max_model_len])


class RecordingChat:
    def __init__(self):
        self.posts: list[tuple[str, str]] = []  # (incident name, channel)
        self.grouped: list[tuple[list[str], str]] = []  # (incident names, channel): post_group calls
        self.updates: list[tuple[str, str, MessageRef]] = []  # (incident name, state, message)
        self.replies: list[tuple[MessageRef, Note]] = []
        self.details: list[tuple[str, MessageRef]] = []  # (incident name, message): post_details calls
        self.told: list[tuple[str, str]] = []
        self.groups: dict[str, set[str]] = {}
        self.down = False
        self.keys: dict[tuple[str, str], MessageRef] = {}  # (channel, post_key) -> message, like Slack's metadata
        self.lookups: list[tuple[str, str]] = []  # find_posted calls: (channel, post_key)
        self._lock = threading.Lock()

    def post_incident(self, incident, channel=None, thread=None):
        if self.down:  # refused outright: certainly not posted
            raise ChatUnavailable("chat.postMessage: service_unavailable")
        with self._lock:
            self.posts.append((incident.name, channel or "C0ALERTS"))
            ref = MessageRef(channel=channel or "C0ALERTS", message_id=f"{len(self.posts)}.0001")
            if incident.post_key:
                self.keys[(ref.channel, incident.post_key)] = ref
            return ref

    def post_group(self, incidents, channel=None):
        if self.down:
            raise ChatUnavailable("chat.postMessage: service_unavailable")
        with self._lock:
            self.grouped.append(([i.name for i in incidents], channel or "C0ALERTS"))
            return MessageRef(channel=channel or "C0ALERTS", message_id=f"{len(self.grouped)}.0002")

    def find_posted(self, channel, post_key, since, thread=None):
        if self.down:
            raise ChatUnavailable("conversations.history: service_unavailable")
        self.lookups.append((channel or "C0ALERTS", post_key))
        return self.keys.get((channel or "C0ALERTS", post_key))

    def post_details(self, incident, message):
        self.details.append((incident.name, message))

    def find_details(self, message, incident_name):
        if self.down:
            raise ChatUnavailable("conversations.replies: service_unavailable")
        return (incident_name, message) in self.details

    def update_incident(self, incident, message):
        if self.down:
            raise ChatUnavailable("chat.update: service_unavailable")
        self.updates.append((incident.name, incident.state, message))

    def reply(self, thread, note):
        self.replies.append((thread, note))

    def find_reply(self, thread, key):
        if self.down:
            raise ChatUnavailable("conversations.replies: service_unavailable")
        return any(t == thread and n.key == key for t, n in self.replies)

    def tell_user(self, channel, user, note):
        self.told.append((user, note_text(note)))  # as Slack would show it

    def permalink(self, message):
        return f"https://chat.example/archives/{message.channel}/p{message.message_id.replace('.', '')}"

    def group_members(self, group_id):
        return self.groups.get(group_id, set())

    def actor(self, user_id):
        return f"slack:{user_id}"  # as Slack's side says it without a user name
