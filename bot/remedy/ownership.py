"""Who owns a pod, and whether a live patch of that owner would last.

Pod -> ReplicaSet -> Deployment, or Pod -> StatefulSet: patchable. A bare Pod, a Job, a bare
ReplicaSet, or a workload owned by another controller (KServe InferenceService,
LeaderWorkerSet, an operator) is not: that controller would put its own spec back. A workload
that Argo CD, Flux or Helm manages is not patched live either: self-heal/reconcile (or the next
`helm upgrade`) reverts it, so the change belongs in the repository; `repository_hint` says which
value to change there.

Pure: `resolve_owner` reads the owners through a `WorkloadReader` the caller passes (the live
API, or nothing at all for files on disk).

Owners are evidence the cluster can forge: anyone who may create a pod may write any
ownerReference and any labels on it. So each owner is read, and accepted only when its uid is the
uid the reference names (Pod -> ReplicaSet, ReplicaSet -> Deployment, Pod -> StatefulSet): a pod
naming a ReplicaSet that does not exist, or another object of that name, resolves to nothing
patchable, whatever its labels say. Names and labels (`<deployment>-<pod-template-hash>`) are
never used to skip a read: that shortcut let a forged pod aim the bot at any Deployment.
"""

from __future__ import annotations

from typing import Any, Protocol

from bot.diagnosis import cmdline
from bot.diagnosis.models import Change, revised
from bot.remedy.models import WorkloadRef

PATCHABLE = ("Deployment", "StatefulSet")

# vLLM production-stack chart: flags that have their own vllmConfig value.
PRODUCTION_STACK_VALUES = {
    "--max-model-len": "maxModelLen",
    "--gpu-memory-utilization": "gpuMemoryUtilization",
    "--tensor-parallel-size": "tensorParallelSize",
    "--max-num-seqs": "maxNumSeqs",
    "--dtype": "dtype",
    "--enable-chunked-prefill": "enableChunkedPrefill",
    "--enable-prefix-caching": "enablePrefixCaching",
}


def controller_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r for r in refs if r.get("controller")), None) or (refs[0] if refs else None)


def detect_gitops(obj: dict[str, Any]) -> tuple[str, str] | None:
    """(managed_by, who) if Argo CD, Flux or Helm manages this object, else None."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    both = {**labels, **annotations}
    tracking = annotations.get("argocd.argoproj.io/tracking-id")
    if tracking:
        return "argocd", f"Argo CD application {tracking.split(':', 1)[0]}"
    if labels.get("argocd.argoproj.io/instance"):
        return "argocd", f"Argo CD application {labels['argocd.argoproj.io/instance']}"
    if labels.get("app.kubernetes.io/instance") and any(k.startswith("argocd.argoproj.io/") for k in annotations):
        return "argocd", f"Argo CD application {labels['app.kubernetes.io/instance']}"
    if both.get("kustomize.toolkit.fluxcd.io/name"):
        ns = both.get("kustomize.toolkit.fluxcd.io/namespace", "")
        return "flux", f"Flux Kustomization {ns + '/' if ns else ''}{both['kustomize.toolkit.fluxcd.io/name']}"
    if both.get("helm.toolkit.fluxcd.io/name"):
        ns = both.get("helm.toolkit.fluxcd.io/namespace", "")
        return "flux", f"Flux HelmRelease {ns + '/' if ns else ''}{both['helm.toolkit.fluxcd.io/name']}"
    if annotations.get("meta.helm.sh/release-name"):
        return "helm", f"Helm release {annotations['meta.helm.sh/release-name']}"
    return None


def gitops_block_reason(managed_by: str, who: str) -> str:
    if managed_by == "helm":
        return (f"managed by {who}: a live patch lasts only until the next `helm upgrade`, which puts the "
                f"chart's values back; change the values in the repository instead")
    return (f"managed by {who}: self-heal/reconcile would revert a live patch within minutes; "
            f"change the source in Git instead")


def is_production_stack(obj: dict[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    chart = str(labels.get("helm.sh/chart", ""))
    return "vllm-stack" in chart or "production-stack" in chart or "helm-release-name" in labels


def repository_hint(obj: dict[str, Any], changes: list[Change], container: str | None = None) -> str:
    """What to change in the repository instead of a live patch."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    lines: list[str] = []
    if is_production_stack(obj):
        model = labels.get("model", "<model name>")
        spec = f"servingEngineSpec.modelSpec[name={model}]"
        for ch in changes:
            if ch.kind == "flag":
                key = PRODUCTION_STACK_VALUES.get(cmdline.canonical(ch.name))
                if key:
                    lines.append(f"{spec}.vllmConfig.{key}: {ch.after if ch.after is not None else '(remove)'}"
                                 f"  (was {ch.before})")
                elif ch.after is None:
                    lines.append(f"{spec}.vllmConfig.extraArgs: remove \"{ch.name}\"")
                elif ch.after == "true":
                    lines.append(f"{spec}.vllmConfig.extraArgs: add \"{ch.name}\"")
                else:
                    lines.append(f"{spec}.vllmConfig.extraArgs: set \"{ch.name}\", \"{ch.after}\"  (was {ch.before})")
            else:
                lines.append(f"{spec}: {_human(ch)}")
        return "vLLM production-stack values:\n" + "\n".join(lines)
    where = f"{obj.get('kind', 'workload')} {meta.get('namespace', '')}/{meta.get('name', '')}"
    who = f", container {container}" if container else ""
    lines = [_human(ch) for ch in changes]
    return f"In the repository's manifest for {where}{who}:\n" + "\n".join(lines)


def _human(ch: Change) -> str:
    if ch.kind == "flag":
        if ch.after is None:
            return f"remove {ch.name} (was {ch.before})"
        if ch.after == "true" and ch.before in (None, "false"):
            return f"add {ch.name}"
        return f"{ch.name} {ch.after} (was {ch.before})"
    label = {"env": "env", "volume": "volume at", "resources": "resources.", "probe": ""}[ch.kind]
    sep = "" if label.endswith(".") or not label else " "
    return f"{label}{sep}{ch.name}: {ch.after if ch.after is not None else '(remove)'} (was {ch.before})"


class WorkloadReader(Protocol):
    def find_workload(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or None when there is no such object."""


def _read_owner(api: WorkloadReader, namespace: str, ref: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The object an ownerReference names, read and checked: (object, "") when it exists and its
    uid is the reference's, else (None, why not)."""
    kind, name, uid = ref.get("kind", ""), ref.get("name", ""), ref.get("uid")
    obj = api.find_workload(kind, namespace, name)
    if obj is None:
        return None, f"its {kind} {name} is gone"
    actual = (obj.get("metadata") or {}).get("uid")
    if not uid or actual != uid:
        return None, (f"its ownerReference names {kind} {name} with uid {uid or '(none)'}, but {kind} {name} "
                      f"has uid {actual or '(none)'}: not this pod's owner, so nothing is patched")
    return obj, ""


def resolve_owner(api: WorkloadReader, pod: dict[str, Any], container: str) -> tuple[WorkloadRef, dict[str, Any]]:
    """The workload a fix would be applied to, and its object (the pod itself when there is none).
    Every owner on the way is read and its uid checked against the reference that names it."""
    meta = pod.get("metadata") or {}
    namespace = meta.get("namespace", "")
    owner = controller_of(pod)
    if owner is None:
        ref = WorkloadRef(kind="Pod", namespace=namespace, name=meta.get("name", ""), container=container,
                          api_version="v1", resource_version=meta.get("resourceVersion"),
                          live_patch_blocked="a bare Pod (no controller): a patched pod is not re-created; "
                                             "change the manifest that created it")
        return with_gitops(ref, pod), pod
    if owner.get("kind") == "ReplicaSet" and owner.get("apiVersion", "apps/v1") == "apps/v1":
        rs, why_not = _read_owner(api, namespace, owner)
        name = owner.get("name", "")
        if rs is None:
            return _blocked(namespace, "ReplicaSet", name, container, why_not), pod
        rs_owner = controller_of(rs)
        if rs_owner is None:
            return with_gitops(_blocked(namespace, "ReplicaSet", name, container,
                                         "a bare ReplicaSet (no Deployment)", rs), rs), rs
        if rs_owner.get("kind") != "Deployment":
            return foreign_controller_ref(namespace, "ReplicaSet", name, container, rs_owner, rs), rs
        owner = rs_owner
    kind, name = owner.get("kind", ""), owner.get("name", "")
    if kind in PATCHABLE:
        return _patchable(api, namespace, owner, container, pod)
    if kind == "Job":
        return _blocked(namespace, "Job", name, container,
                        "a Job's pod template cannot be changed; change the Job's manifest and re-create it",
                        api_version=owner.get("apiVersion", "batch/v1")), pod
    return foreign_controller_ref(namespace, "Pod", meta.get("name", ""), container, owner, pod), pod


def _patchable(api: WorkloadReader, namespace: str, owner: dict[str, Any], container: str,
               pod: dict[str, Any]) -> tuple[WorkloadRef, dict[str, Any]]:
    """A Deployment or StatefulSet an ownerReference names: read, uid checked, and patchable
    unless another controller or GitOps owns it."""
    kind, name = owner.get("kind", ""), owner.get("name", "")
    obj, why_not = _read_owner(api, namespace, owner)
    if obj is None:
        return _blocked(namespace, kind, name, container, why_not), pod
    foreign = controller_of(obj)
    if foreign is not None:
        return foreign_controller_ref(namespace, kind, name, container, foreign, obj), obj
    ref = WorkloadRef(kind=kind, namespace=namespace, name=name, container=container,
                      resource_version=(obj.get("metadata") or {}).get("resourceVersion"))
    return with_gitops(ref, obj), obj


def _blocked(namespace: str, kind: str, name: str, container: str, reason: str,
             obj: dict[str, Any] | None = None, api_version: str = "apps/v1") -> WorkloadRef:
    rv = ((obj or {}).get("metadata") or {}).get("resourceVersion")
    return WorkloadRef(kind=kind, namespace=namespace, name=name, container=container, api_version=api_version,
                       resource_version=rv, live_patch_blocked=reason)


def foreign_controller_ref(namespace: str, kind: str, name: str, container: str, owner: dict[str, Any],
             obj: dict[str, Any]) -> WorkloadRef:
    reason = (f"owned by {owner.get('kind')} {owner.get('name')} ({owner.get('apiVersion', '?')}): that "
              f"controller would put its own spec back; change the {owner.get('kind')} instead")
    ref = _blocked(namespace, kind, name, container, reason, obj)
    return with_gitops(ref, obj)


def with_gitops(ref: WorkloadRef, obj: dict[str, Any]) -> WorkloadRef:
    found = detect_gitops(obj)
    if found is None:
        return ref
    managed_by, who = found
    reason = gitops_block_reason(managed_by, who)
    if ref.live_patch_blocked:
        reason = f"{ref.live_patch_blocked}; also {reason}"
    return revised(ref, live_patch_blocked=reason, managed_by=managed_by)
