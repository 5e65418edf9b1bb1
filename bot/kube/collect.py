"""Evidence from a live cluster: the same Evidence a bundle on disk gives, read through the API.

- the previous container's log, its head (vLLM prints its engine config there) and its tail (where
  it died), even when it is huge: the head with limitBytes, the tail with tailLines, and
  LogText.truncated_middle=True when the middle was dropped. If the kubelet no longer has the
  previous container's log, the current one is used and an Event-shaped note says so.
- the pod's events, when they can explain the crash (`events_can_explain`), and the node.
- for a ticket bundle only (`gpu_pods=True`, `vllm-oncall collect`): the other pods on that node
  holding nvidia.com/gpu. Nothing in the diagnosis reads them, so an alert does not list them.

Notes the bot adds (documented, so readers can rely on them):
- evidence.events may contain an entry with reason "VllmOncallNote" (source.component
  "vllm-oncall") saying what could not be read (previous log gone, node not readable).
- with gpu_pods=True, node.metadata.annotations["vllm-oncall/gpu-pods"] is a JSON list of the
  *other* pods on the node that request or limit nvidia.com/gpu:
  [{"pod": "ns/name", "gpus": "1", "phase": "Running"}].
"""

from __future__ import annotations

import difflib
import json
import logging
from pathlib import Path
from typing import Any

import yaml

from bot.diagnosis.evidence import pick_container
from bot.diagnosis.models import Evidence, LogText
from bot.kube.api import NOT_AN_API_SERVER, KubeApi
from bot.kube.errors import KubeError, KubeForbidden, KubeNotFound, PodGone, PreviousLogGone

log = logging.getLogger("bot.kube")

HEAD_BYTES = 512 * 1024  # the engine config and model loading lines are near the top
TAIL_LINES = 3000  # the traceback and the last numbers before the crash
GPU_PODS_ANNOTATION = "vllm-oncall/gpu-pods"
MIDDLE_MARKER = "\n[... vllm-oncall: the middle of this log was not fetched ...]\n"


def note(message: str, namespace: str, pod: str) -> dict[str, Any]:
    return {"reason": "VllmOncallNote", "type": "Warning", "message": message,
            "involvedObject": {"kind": "Pod", "namespace": namespace, "name": pod},
            "source": {"component": "vllm-oncall"}}


def get_pod_or_suggest(api: KubeApi, namespace: str, name: str) -> dict[str, Any]:
    """The pod, or PodGone naming close matches and the newest pod of the same workload."""
    try:
        return api.get_pod(namespace, name)
    except KubeNotFound as exc:
        if NOT_AN_API_SERVER in str(exc):
            raise  # not a missing pod: the URL is not an API server, and the error says so
    pods = workload_pods(api, namespace, name)
    names = [p["metadata"]["name"] for p in pods]
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.6)
    raise PodGone(namespace, name, close, newest_of_workload=newest_sibling(name, pods))


def workload_pods(api: KubeApi, namespace: str, name: str) -> list[dict[str, Any]]:
    """The pods of the workload a gone pod's name points at (a Deployment's pod is
    `<deployment>-<template hash>-<5 chars>`, a StatefulSet's `<statefulset>-<ordinal>`), listed by
    that workload's own selector: never the whole namespace, whose 10,000 pods would cost seconds.
    Only for suggestions: nothing is decided from them. [] when no such workload is readable."""
    parts = name.split("-")
    for kind, cut in (("Deployment", 2), ("StatefulSet", 1)):
        if len(parts) <= cut:
            continue
        try:
            workload = api.find_workload(kind, namespace, "-".join(parts[:-cut]))
            labels = (((workload or {}).get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            if labels:
                return api.list_pods(namespace, label_selector=",".join(f"{k}={v}" for k, v in sorted(labels.items())))
        except KubeForbidden as exc:  # no right to read that kind: suggest nothing rather than fail
            log.info("no suggestions for gone pod %s/%s: %s", namespace, name, exc)
    return []


def age_key(obj: dict[str, Any]) -> tuple[str, int]:
    """Sort key, oldest first: creationTimestamp has one-second resolution, so the
    resourceVersion (a newer object was written later) breaks ties."""
    meta = obj.get("metadata") or {}
    rv = str(meta.get("resourceVersion") or "0")
    return meta.get("creationTimestamp") or "", int(rv) if rv.isdigit() else 0


def newest_sibling(name: str, pods: list[dict[str, Any]]) -> str | None:
    """The newest pod whose name has the same workload prefix (name minus its random suffixes)."""
    parts = name.split("-")
    for cut in (2, 1):  # Deployment pods: <deploy>-<rs hash>-<suffix>; StatefulSet: <sts>-<ordinal>
        if len(parts) <= cut:
            continue
        prefix = "-".join(parts[:-cut]) + "-"
        siblings = [p for p in pods if p["metadata"]["name"].startswith(prefix)
                    and len(p["metadata"]["name"].split("-")) == len(parts)]
        if siblings:
            newest = max(siblings, key=age_key)
            return newest["metadata"]["name"]
    return None


def read_head_and_tail(api: KubeApi, namespace: str, pod: str, container: str, previous: bool,
                       head_bytes: int = HEAD_BYTES, tail_lines: int = TAIL_LINES) -> LogText:
    """The log's beginning and end; the middle is dropped only when the log is larger than both."""
    head = api.read_log(namespace, pod, container, previous=previous, limit_bytes=head_bytes + 1)
    if len(head.encode("utf-8")) <= head_bytes:
        return LogText(text=head)  # the whole log fit
    head = head.encode("utf-8")[:head_bytes].decode("utf-8", errors="ignore")
    head = head[: head.rfind("\n") + 1] if "\n" in head else head  # no half line at the cut
    tail = api.read_log(namespace, pod, container, previous=previous, tail_lines=tail_lines)
    joined, dropped = join_head_and_tail(head, tail)
    return LogText(text=joined, truncated_middle=dropped)


def join_head_and_tail(head: str, tail: str) -> tuple[str, bool]:
    """Head + tail without repeating lines both contain; (text, whether a middle part is missing)."""
    tail_lines = tail.splitlines(keepends=True)
    if not tail_lines:
        return head, True
    head_lines = head.splitlines(keepends=True)
    # If the tail starts inside the head, the two overlap and nothing is missing.
    first = tail_lines[0]
    for i in range(len(head_lines) - 1, -1, -1):
        if head_lines[i] == first and head_lines[i:] == tail_lines[: len(head_lines) - i]:
            return "".join(head_lines[:i]) + tail, False
    return head + MIDDLE_MARKER + tail, True


def read_crash_log(api: KubeApi, namespace: str, pod: str, container: str,
                   head_bytes: int = HEAD_BYTES, tail_lines: int = TAIL_LINES) -> tuple[LogText, list[dict]]:
    """The previous container's log; the current one (with a note) when the previous is gone."""
    try:
        return read_head_and_tail(api, namespace, pod, container, True, head_bytes, tail_lines), []
    except PreviousLogGone as gone:
        message = gone.server_message
    log.info("previous log of %s/%s[%s] is gone; using the current log", namespace, pod, container)
    text = (f"The previous container's log is no longer available ({message}); "
            f"diagnosing from the current container's log instead.")
    return read_head_and_tail(api, namespace, pod, container, False, head_bytes, tail_lines), [
        note(text, namespace, pod)]


def requests_gpu(pod: dict[str, Any]) -> str | None:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        value = (res.get("limits") or {}).get("nvidia.com/gpu") or (res.get("requests") or {}).get("nvidia.com/gpu")
        try:
            total += int(str(value)) if value is not None else 0
        except ValueError:
            continue
    return str(total) if total else None


def read_node(api: KubeApi, node_name: str, namespace: str, pod_name: str,
              whole: bool = False) -> tuple[dict | None, list]:
    """The Node, or None and a note saying why it could not be read. Without `whole`, its
    status.images is left out: the list of every image pulled on the node (up to 50, each with its
    names and digests: 10-20 KB on a GPU node) is read by nothing, yet went with the evidence into
    each incident, redacted, sealed, written and read back with every write. A ticket bundle
    (`whole`) keeps the node as `kubectl get node -o yaml` prints it."""
    try:
        node = api.get_node(node_name)
    except KubeError as exc:
        # Node access is cluster-scoped; a namespace-only install may lack it. Diagnose without it.
        return None, [note(f"node {node_name} could not be read: {exc}", namespace, pod_name)]
    status = node.get("status") if isinstance(node, dict) else None
    if not whole and isinstance(status, dict):
        status.pop("images", None)
    return node, []


def node_with_gpu_pods(api: KubeApi, node_name: str, namespace: str, pod_name: str) -> tuple[dict | None, list]:
    """The Node, whole, annotated with the other GPU pods on it; notes for what could not be read."""
    node, notes = read_node(api, node_name, namespace, pod_name, whole=True)
    if node is None:
        return None, notes
    try:
        neighbours = api.list_pods_on_node(node_name)
    except KubeError as exc:
        notes.append(note(f"pods on node {node_name} could not be listed: {exc}", namespace, pod_name))
        neighbours = []
    gpu_pods = []
    for p in neighbours:
        meta = p.get("metadata") or {}
        if (meta.get("namespace"), meta.get("name")) == (namespace, pod_name):
            continue
        phase = (p.get("status") or {}).get("phase")
        gpus = requests_gpu(p)
        if gpus and phase not in ("Succeeded", "Failed"):
            gpu_pods.append({"pod": f"{meta.get('namespace')}/{meta.get('name')}", "gpus": gpus, "phase": phase})
    node.setdefault("metadata", {}).setdefault("annotations", {})[GPU_PODS_ANNOTATION] = json.dumps(gpu_pods)
    return node, notes


def events_can_explain(pod: dict[str, Any], container: str) -> bool:
    """Whether the pod's events may hold the cause of the container's last death.

    The diagnosis reads events only for kills from outside the process: a failed liveness or
    startup probe (the kubelet's SIGTERM, then SIGKILL) and the kernel's OOM killer (OOMKilling,
    SystemOOM). Those end the container with a signal's exit code (128 + n), a signal, a reason
    other than "Error" (OOMKilled), or exit 0 (vLLM shutting down cleanly on SIGTERM). An ordinary
    error exit (0 < code < 128, no signal, reason "Error") is the application raising: its log
    says why and no event changes that. With nothing to go on (no lastState.terminated), read them.
    """
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    status = next((s for s in statuses if s.get("name") == container), None) or {}
    terminated = (status.get("lastState") or {}).get("terminated")
    if not terminated:
        return True
    code = terminated.get("exitCode")
    ordinary_error = (isinstance(code, int) and 0 < code < 128 and not terminated.get("signal")
                      and terminated.get("reason") == "Error")
    return not ordinary_error


def collect(api: KubeApi, namespace: str, pod_name: str, container: str | None = None,
            head_bytes: int = HEAD_BYTES, tail_lines: int = TAIL_LINES, gpu_pods: bool = False) -> Evidence:
    """The Evidence of one pod: the pod, its crashed container's log, its node, and its events
    only when they can explain the crash (`events_can_explain`: a kill by signal, a probe, the
    OOM killer, or no record of the last exit; not an ordinary error exit such as exit 1 with
    reason Error). `gpu_pods`: also list the other GPU pods on the node (GPU_PODS_ANNOTATION),
    for a ticket bundle; the diagnosis does not read them, so alerts leave it off."""
    pod = get_pod_or_suggest(api, namespace, pod_name)
    chosen = pick_container(pod, container)
    if chosen is None:
        raise ValueError(f"pod {namespace}/{pod_name} has no containers")
    name = chosen["name"]
    log_text, notes = read_crash_log(api, namespace, pod_name, name, head_bytes, tail_lines)
    events: list[dict[str, Any]] = []
    if events_can_explain(pod, name):
        events = sorted(api.list_events(namespace, pod_name),
                        key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    node = None
    node_name = (pod.get("spec") or {}).get("nodeName")
    if node_name:
        read = node_with_gpu_pods if gpu_pods else read_node
        node, node_notes = read(api, node_name, namespace, pod_name)
        notes += node_notes
    return Evidence(log=log_text, pod=pod, node=node, events=events + notes, container=name,
                    source=f"{namespace}/{pod_name}")


def write_bundle(evidence: Evidence, folder: Path, workload: dict[str, Any] | None = None) -> list[Path]:
    """An evidence bundle bot.evidence.load_bundle reads back: previous.log, pod.yaml, node.yaml,
    events.yaml, and the owning workload's manifest (deployment.yaml / statefulset.yaml)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    text = evidence.log.text if evidence.log.text is not None else Path(evidence.log.path or "").read_text()
    (folder / "previous.log").write_text(text, encoding="utf-8")
    written.append(folder / "previous.log")

    def dump(name: str, doc: Any) -> None:
        path = folder / name
        path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1000), encoding="utf-8")
        written.append(path)

    if evidence.pod:
        dump("pod.yaml", {"apiVersion": "v1", "kind": "Pod", **_without_managed_fields(evidence.pod)})
    if evidence.node:
        dump("node.yaml", {"apiVersion": "v1", "kind": "Node", **_without_managed_fields(evidence.node)})
    dump("events.yaml", {"apiVersion": "v1", "kind": "List", "items": evidence.events})
    if workload and workload.get("kind") in ("Deployment", "StatefulSet"):
        dump(f"{workload['kind'].lower()}.yaml", _without_managed_fields(workload))
    return written


def _without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(obj))
    (out.get("metadata") or {}).pop("managedFields", None)
    return out
