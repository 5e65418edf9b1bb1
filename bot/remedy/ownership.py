"""Who owns a pod, and whether a live patch of that owner would last.

Pod -> ReplicaSet -> Deployment, or Pod -> StatefulSet: patchable. A bare Pod, a Job, a bare
ReplicaSet, or a workload owned by another controller (KServe InferenceService,
LeaderWorkerSet, an operator) is not: that controller would put its own spec back. A workload
that Argo CD, Flux or Helm manages is not patched live either: self-heal/reconcile (or the next
`helm upgrade`) reverts it, so the change belongs in the repository; `repository_hint` says which
value to change there.

Pure: `resolve_owner` reads the owners through a `WorkloadReader` the caller passes (the live
API, or nothing at all for files on disk).

Pod -> ReplicaSet -> Deployment costs one read, not two, in the usual case: a Deployment names
its ReplicaSets `<deployment>-<pod-template-hash>` and labels their pods with that hash, so
`deployment_by_replicaset_name` reads the Deployment directly and accepts it only when its
selector matches the pod and nothing owns it. Otherwise (no such Deployment, another selector,
no `pod-template-hash` label, e.g. Argo Rollouts' `rollouts-pod-template-hash`) the ReplicaSet
is read and its ownerReference decides, as before.
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


def _fetch(api: WorkloadReader, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    return api.find_workload(kind, namespace, name)


POD_TEMPLATE_HASH = "pod-template-hash"  # the label the Deployment controller puts on its ReplicaSets' pods


def selector_matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) against labels. An empty or missing
    selector, or an operator this does not know, counts as no match: the caller then reads the
    ReplicaSet instead of trusting a guess."""
    selector = selector or {}
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not match_labels and not expressions:
        return False
    if any(labels.get(key) != value for key, value in match_labels.items()):
        return False
    for expr in expressions:
        key, operator, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def deployment_by_replicaset_name(api: WorkloadReader, pod: dict[str, Any], replicaset: str
                                  ) -> dict[str, Any] | None:
    """The Deployment that owns the pod's ReplicaSet, read without reading the ReplicaSet, or None
    when that cannot be told from the names and labels alone (then read the ReplicaSet).

    The ReplicaSet must be named `X-H` with H the pod's `pod-template-hash` label; Deployment X
    must exist, select the pod (its spec.selector matches the pod's labels) and have no owner of
    its own (a foreign controller's Deployment goes the long way, which reports that owner)."""
    meta = pod.get("metadata") or {}
    template_hash = (meta.get("labels") or {}).get(POD_TEMPLATE_HASH)
    suffix = f"-{template_hash}"
    if not template_hash or not replicaset.endswith(suffix) or len(replicaset) == len(suffix):
        return None
    deployment = _fetch(api, "Deployment", meta.get("namespace", ""), replicaset[: -len(suffix)])
    if deployment is None or controller_of(deployment) is not None:
        return None
    if not selector_matches((deployment.get("spec") or {}).get("selector"), meta.get("labels") or {}):
        return None
    return deployment


def resolve_owner(api: WorkloadReader, pod: dict[str, Any], container: str) -> tuple[WorkloadRef, dict[str, Any]]:
    """The workload a fix would be applied to, and its object (the pod itself when there is none)."""
    meta = pod.get("metadata") or {}
    namespace = meta.get("namespace", "")
    owner = controller_of(pod)
    if owner is None:
        ref = WorkloadRef(kind="Pod", namespace=namespace, name=meta.get("name", ""), container=container,
                          api_version="v1", resource_version=meta.get("resourceVersion"),
                          live_patch_blocked="a bare Pod (no controller): a patched pod is not re-created; "
                                             "change the manifest that created it")
        return with_gitops(ref, pod), pod
    kind, name = owner.get("kind", ""), owner.get("name", "")
    obj: dict[str, Any] | None = None
    if kind == "ReplicaSet" and owner.get("apiVersion", "apps/v1") == "apps/v1":
        obj = deployment_by_replicaset_name(api, pod, name)
    if obj is not None:
        kind, name = "Deployment", (obj.get("metadata") or {}).get("name", "")
    elif kind == "ReplicaSet" and owner.get("apiVersion", "apps/v1") == "apps/v1":
        rs = _fetch(api, "ReplicaSet", namespace, name)
        if rs is None:
            return _blocked(namespace, "ReplicaSet", name, container, "its ReplicaSet is gone"), pod
        rs_owner = controller_of(rs)
        if rs_owner is None:
            return with_gitops(_blocked(namespace, "ReplicaSet", name, container,
                                         "a bare ReplicaSet (no Deployment)", rs), rs), rs
        if rs_owner.get("kind") != "Deployment":
            return foreign_controller_ref(namespace, "ReplicaSet", name, container, rs_owner, rs), rs
        kind, name = "Deployment", rs_owner.get("name", "")
    if kind in PATCHABLE:
        obj = obj if obj is not None else _fetch(api, kind, namespace, name)
        if obj is None:
            return _blocked(namespace, kind, name, container, f"its {kind} is gone"), pod
        foreign = controller_of(obj)
        if foreign is not None:
            return foreign_controller_ref(namespace, kind, name, container, foreign, obj), obj
        ref = WorkloadRef(kind=kind, namespace=namespace, name=name, container=container,
                          resource_version=(obj.get("metadata") or {}).get("resourceVersion"))
        return with_gitops(ref, obj), obj
    if kind == "Job":
        return _blocked(namespace, "Job", name, container,
                        "a Job's pod template cannot be changed; change the Job's manifest and re-create it",
                        api_version=owner.get("apiVersion", "batch/v1")), pod
    return foreign_controller_ref(namespace, "Pod", meta.get("name", ""), container, owner, pod), pod


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
