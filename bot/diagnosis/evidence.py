"""Evidence bundles on disk, and the flattened views of Pod and Node a diagnosis reads.

A bundle is a folder with `previous.log` (required) and optional `pod.yaml`, `node.yaml`,
`events.yaml`: exactly what `kubectl logs --previous` and `kubectl get ... -o yaml` print.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

from bot.diagnosis.models import BundleError, ContainerView, Evidence, LogText, NodeView, PodView
from bot.support import yamlload

LOG_NAMES = ("previous.log", "previous.txt", "log.txt")


def load_bundle(folder: str | Path) -> Evidence:
    folder = Path(folder)
    if not folder.exists():
        raise BundleError(f"{folder}: no such bundle folder")
    if folder.is_file():
        return Evidence(log=LogText(path=folder), source=str(folder))
    log = next((folder / n for n in LOG_NAMES if (folder / n).is_file()), None)
    if log is None:
        raise BundleError(f"{folder}: not an evidence bundle (no previous.log)")
    pod = _load_yaml(folder / "pod.yaml", "Pod")
    node = _load_yaml(folder / "node.yaml", "Node")
    events_doc = _load_yaml(folder / "events.yaml", None)
    events: list[dict[str, Any]] = []
    if isinstance(events_doc, dict):
        events = list(events_doc.get("items") or [])
    elif isinstance(events_doc, list):
        events = events_doc
    return Evidence(log=LogText(path=log), pod=pod, node=node, events=events, source=str(folder))


def load_log(path: str | Path) -> Evidence:
    path = Path(path)
    if not path.is_file():
        raise BundleError(f"{path}: no such log file")
    return Evidence(log=LogText(path=path), source=str(path))


def _load_yaml(path: Path, kind: str | None) -> Any:
    if not path.is_file():
        return None
    try:
        doc = yamlload.safe_load(path.read_text(encoding="utf-8", errors="replace"))
    except yamlload.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise BundleError(f"{path}:{where} is not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if doc is None:
        return None
    if kind and (not isinstance(doc, dict) or doc.get("kind", kind) != kind):
        if isinstance(doc, dict) and doc.get("kind") == "List" and doc.get("items"):
            doc = doc["items"][0]
        else:
            raise BundleError(f"{path}: expected a {kind} object, got {type(doc).__name__}"
                              f"{' of kind ' + str(doc.get('kind')) if isinstance(doc, dict) else ''}")
    return doc


# ---- views --------------------------------------------------------------------------------

VLLM_HINTS = ("vllm", "serve", "api_server")


def pick_container(pod: dict[str, Any], wanted: str | None) -> dict[str, Any] | None:
    containers = (pod.get("spec") or {}).get("containers") or []
    if wanted:
        for c in containers:
            if c.get("name") == wanted:
                return c
    for c in containers:
        blob = " ".join([c.get("image", "")] + [str(x) for x in (c.get("command") or []) + (c.get("args") or [])])
        if any(h in blob for h in VLLM_HINTS):
            return c
    return containers[0] if containers else None


def pod_view(evidence: Evidence) -> PodView:
    pod = evidence.pod or {}
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    c = pick_container(pod, evidence.container) if pod else None
    container = None
    if c is not None:
        status: dict[str, Any] = next((s for s in (pod.get("status") or {}).get("containerStatuses") or []
                       if s.get("name") == c.get("name")), {})
        last = ((status.get("lastState") or {}).get("terminated")) or {}
        if not last:
            last = ((status.get("state") or {}).get("terminated")) or {}
        resources = c.get("resources") or {}
        env = {e["name"]: str(e.get("value", "")) for e in c.get("env") or [] if "name" in e}
        probe = c.get("livenessProbe")
        budget = None
        if probe:
            budget = int(probe.get("initialDelaySeconds", 0)) + int(probe.get("periodSeconds", 10)) * int(
                probe.get("failureThreshold", 3))
        container = ContainerView(
            name=c.get("name", ""),
            image=c.get("image", ""),
            command=[str(x) for x in c["command"]] if c.get("command") is not None else None,
            args=[str(x) for x in c["args"]] if c.get("args") is not None else None,
            env=env,
            limits={k: str(v) for k, v in (resources.get("limits") or {}).items()},
            requests={k: str(v) for k, v in (resources.get("requests") or {}).items()},
            mounts={m.get("mountPath", ""): m.get("name", "") for m in c.get("volumeMounts") or []},
            has_liveness_probe=probe is not None,
            has_startup_probe=c.get("startupProbe") is not None,
            liveness_budget_seconds=budget,
            restart_count=int(status.get("restartCount") or 0),
            last_exit_code=last.get("exitCode"),
            last_reason=last.get("reason"),
            last_finished_after_seconds=_lifetime(last),
        )
    shm = None
    if container and "/dev/shm" in container.mounts:
        vol_name = container.mounts["/dev/shm"]
        shm = next((v for v in spec.get("volumes") or [] if v.get("name") == vol_name), {"name": vol_name})
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None) or next(
        iter(meta.get("ownerReferences") or []), None)
    events = evidence.events or []
    return PodView(
        namespace=str(meta.get("namespace") or ""),  # a manifest may leave it out, or write it empty
        name=str(meta.get("name") or ""),
        node_name=spec.get("nodeName"),
        container=container,
        shm_volume=shm,
        host_ipc=bool(spec.get("hostIPC")),
        owner_kind=owner.get("kind") if owner else None,
        owner_name=owner.get("name") if owner else None,
        event_reasons=[str(e.get("reason", "")) for e in events],
        event_messages=[str(e.get("message", "")) for e in events],
    )


def _lifetime(terminated: dict[str, Any]) -> float | None:
    try:
        start = datetime.fromisoformat(str(terminated["startedAt"]).replace("Z", "+00:00"))
        end = datetime.fromisoformat(str(terminated["finishedAt"]).replace("Z", "+00:00"))
        return (end - start).total_seconds()
    except (KeyError, ValueError):
        return None


def node_view(evidence: Evidence) -> NodeView:
    node = evidence.node or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    status = node.get("status") or {}
    cap = status.get("capacity") or {}
    alloc = status.get("allocatable") or {}

    def as_int(v: Any) -> int | None:
        try:
            return int(str(v))
        except (TypeError, ValueError):
            return None

    return NodeView(
        name=(node.get("metadata") or {}).get("name"),
        gpu_product=labels.get("nvidia.com/gpu.product") or None,
        gpu_memory_mib=as_int(labels.get("nvidia.com/gpu.memory")),
        gpu_count=as_int(labels.get("nvidia.com/gpu.count")),
        gpu_capacity=as_int(cap.get("nvidia.com/gpu")),
        mig_strategy=labels.get("nvidia.com/mig.strategy"),
        sharing_strategy=labels.get("nvidia.com/gpu.sharing-strategy"),
        replicas=as_int(labels.get("nvidia.com/gpu.replicas")),
        memory_allocatable_bytes=parse_quantity(alloc.get("memory")) if alloc.get("memory") else None,
    )


def gpu_summary(node: NodeView) -> str | None:
    """"2 x NVIDIA-A100-SXM4-80GB, 80 GiB" from the GPU feature discovery labels, or None."""
    if not node.gpu_product:
        return None
    memory = f", {node.gpu_memory_mib / 1024:.0f} GiB" if node.gpu_memory_mib else ""
    count = f"{node.gpu_count} x " if node.gpu_count and node.gpu_count > 1 else ""
    return f"{count}{node.gpu_product}{memory}"


_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60, "m": 0.001}


def parse_quantity(value: Any) -> int | None:
    """Kubernetes resource quantity ("64Gi", "20G", "512Mi") to a whole number."""
    m = _QUANTITY.match(str(value).strip())
    if not m or m.group(2) not in _UNITS:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def format_gib_quantity(n_bytes: int) -> str:
    return f"{-(-n_bytes // 2**30)}Gi"
