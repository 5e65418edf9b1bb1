"""Builders for the objects a crash-looping vLLM workload has in a cluster, and a stand-in
Deployment controller for verification tests."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from kubeapi.server import FakeKube

GPU_NODE_LABELS = {
    "nvidia.com/gpu.product": "NVIDIA-A10G",
    "nvidia.com/gpu.memory": "23028",
    "nvidia.com/gpu.count": "1",
}


def container(command: list[str] | None = None, args: list[str] | None = None, name: str = "vllm",
              **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "vllm/vllm-openai:v0.11.0"}
    if command is not None:
        c["command"] = command
    if args is not None:
        c["args"] = args
    c["resources"] = {"limits": {"nvidia.com/gpu": "1", "memory": "32Gi"},
                      "requests": {"nvidia.com/gpu": "1", "memory": "32Gi"}}
    c["ports"] = [{"containerPort": 8000, "name": "http"}]
    c.update(extra)
    return c


def deployment(name: str, containers: list[dict[str, Any]], namespace: str = "inference",
               labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
               volumes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    selector = {"app": name}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {**selector, **(labels or {})}}
    if annotations:
        meta["annotations"] = annotations
    pod_spec: dict[str, Any] = {"containers": containers}
    if volumes:
        pod_spec["volumes"] = volumes
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
            "spec": {"replicas": 1, "selector": {"matchLabels": selector},
                     "template": {"metadata": {"labels": dict(selector)}, "spec": pod_spec}}}


def node(name: str = "gpu-node-1", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {**GPU_NODE_LABELS, **(labels or {})}},
            "status": {"capacity": {"nvidia.com/gpu": "1", "memory": "64Gi"},
                       "allocatable": {"nvidia.com/gpu": "1", "memory": "62Gi"}}}


def template_hash(pod_spec: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(pod_spec, sort_keys=True).encode()).hexdigest()[:10]


def pod_status(container_name: str, state: str, restarts: int = 0, exit_code: int = 1) -> dict[str, Any]:
    """state: crashloop | ready | starting. A crashloop's last exit is `exit_code` (reason Error,
    as the kubelet reports both an application's exit 1 and a probe's SIGKILL, 137)."""
    cs: dict[str, Any] = {"name": container_name, "restartCount": restarts, "ready": state == "ready",
                          "image": "vllm/vllm-openai:v0.11.0"}
    if state == "crashloop":
        cs["state"] = {"waiting": {"reason": "CrashLoopBackOff",
                                   "message": f"back-off 5m0s restarting failed container={container_name}"}}
        cs["lastState"] = {"terminated": {"exitCode": exit_code, "reason": "Error",
                                          "startedAt": "2026-11-30T05:00:00Z",
                                          "finishedAt": "2026-11-30T05:01:30Z"}}
        cs["restartCount"] = max(restarts, 1)
        return {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [cs]}
    if state == "ready":
        cs["state"] = {"running": {"startedAt": "2026-11-30T05:10:00Z"}}
        return {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}], "containerStatuses": [cs]}
    cs["state"] = {"running": {"startedAt": "2026-11-30T05:10:00Z"}}
    return {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}], "containerStatuses": [cs]}


def start_pod(fake: FakeKube, workload: dict[str, Any], state: str, log: str = "", previous_log: str | None = None,
              suffix: str = "abcde", node_name: str = "gpu-node-1", restarts: int = 0,
              exit_code: int = 1) -> dict[str, Any]:
    """Create the ReplicaSet for the workload's current template (Deployment) and one pod of it."""
    meta = workload["metadata"]
    ns = meta["namespace"]
    pod_spec = copy.deepcopy(workload["spec"]["template"]["spec"])
    labels = dict(workload["spec"]["template"]["metadata"]["labels"])
    if workload["kind"] == "Deployment":
        h = template_hash(pod_spec)
        rs_name = f"{meta['name']}-{h}"
        if fake.get("ReplicaSet", rs_name, ns) is None:
            fake.put({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                      "metadata": {"name": rs_name, "namespace": ns, "labels": {**labels, "pod-template-hash": h},
                                   "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                                        "name": meta["name"], "uid": meta["uid"],
                                                        "controller": True}]},
                      "spec": {"replicas": 1, "selector": workload["spec"]["selector"],
                               "template": {"metadata": {"labels": {**labels, "pod-template-hash": h}},
                                            "spec": copy.deepcopy(pod_spec)}}})
        rs = fake.get("ReplicaSet", rs_name, ns)
        owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs_name, "uid": rs["metadata"]["uid"],
                 "controller": True}
        pod_name = f"{rs_name}-{suffix}"
        labels = {**labels, "pod-template-hash": h}
    else:
        owner = {"apiVersion": "apps/v1", "kind": workload["kind"], "name": meta["name"], "uid": meta["uid"],
                 "controller": True}
        pod_name = f"{meta['name']}-{suffix}"
    pod_spec["nodeName"] = node_name
    container_name = pod_spec["containers"][0]["name"]
    pod = fake.put({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pod_name, "namespace": ns, "labels": labels, "ownerReferences": [owner]},
                    "spec": pod_spec, "status": pod_status(container_name, state, restarts, exit_code)})
    fake.set_log(ns, pod_name, container_name, log, previous=False)
    if previous_log is not None:
        fake.set_log(ns, pod_name, container_name, previous_log, previous=True)
    return pod


def crowd(kube: FakeKube, pods: int, workloads: int = 50, namespace: str = "inference") -> None:
    """`pods` other (ready) pods in the namespace, over `workloads` Deployments, stored directly: fast."""
    c = [container(command=["vllm", "serve", "m"])]
    for w in range(workloads):
        dep = kube.put(deployment(f"other-{w:03d}", c, namespace))
        template = start_pod(kube, dep, "ready", suffix="aaaaa")
        for i in range(pods // workloads - 1):
            pod = copy.deepcopy(template)
            pod["metadata"]["name"] = template["metadata"]["name"][:-5] + f"{i:05d}"
            for key in ("uid", "resourceVersion"):
                pod["metadata"].pop(key, None)
            kube.put(pod)


def crashing_deployment(fake: FakeKube, name: str = "llama", containers: list[dict[str, Any]] | None = None,
                        previous_log: str = "", labels: dict[str, str] | None = None,
                        annotations: dict[str, str] | None = None, namespace: str = "inference",
                        events: bool = True, exit_code: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Deployment whose only pod is in CrashLoopBackOff; returns (deployment, pod).

    events: the kubelet's events of a liveness-probe kill (BackOff, Killing); the pod's last exit
    is then that kill's 137, else an application's exit 1, unless `exit_code` says otherwise."""
    if exit_code is None:
        exit_code = 137 if events else 1
    fake.put(node())
    dep = fake.put(deployment(name, containers or [container(args=["--model", "m"])], namespace,
                              labels, annotations))
    pod = start_pod(fake, dep, "crashloop", previous_log=previous_log, restarts=5, exit_code=exit_code)
    if events:
        for i, (reason, message) in enumerate([("BackOff", "Back-off restarting failed container vllm"),
                                               ("Killing", "Container vllm failed liveness probe")]):
            fake.put({"apiVersion": "v1", "kind": "Event",
                      "metadata": {"name": f"{pod['metadata']['name']}.{i}", "namespace": namespace},
                      "involvedObject": {"kind": "Pod", "name": pod["metadata"]["name"], "namespace": namespace},
                      "reason": reason, "message": message, "type": "Warning",
                      "lastTimestamp": f"2026-11-30T05:0{i}:00Z"})
    return dep, pod


def rollout_controller(state: str, log: str = "", previous_log: str | None = None):
    """An on_write hook: when a Deployment's template changes, start one pod of the new template."""

    def hook(fake: FakeKube, new: dict[str, Any], old: dict[str, Any] | None) -> None:
        if new.get("kind") != "Deployment" or old is None:
            return
        if new["spec"]["template"] == old["spec"]["template"]:
            return
        start_pod(fake, new, state, log=log, previous_log=previous_log, suffix="newpd", restarts=0)

    return hook
