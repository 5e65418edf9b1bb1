"""Builders for test evidence: bundles on disk, pods and nodes as the API returns them, and where
the repository, the shared corpus and our fixture bundles are."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SHARED_CORPUS = ROOT.parent / "shared" / "corpus"
FIXTURE_BUNDLES = ROOT / "tests" / "fixtures" / "bundles"
EXAMPLE = ROOT / "examples" / "incident"
EXAMPLE_BUNDLE = EXAMPLE / "bundle"


def write_bundle(folder: Path, log: str | bytes, pod: dict | None = None, node: dict | None = None,
                 events: list | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = log.encode() if isinstance(log, str) else log
    (folder / "previous.log").write_bytes(data)
    if pod is not None:
        (folder / "pod.yaml").write_text(yaml.safe_dump(pod))
    if node is not None:
        (folder / "node.yaml").write_text(yaml.safe_dump(node))
    if events is not None:
        (folder / "events.yaml").write_text(yaml.safe_dump({"items": events}))
    return folder


def make_pod(command=None, args=None, gpus="1", memory="64Gi", exit_code=1, reason="Error", volumes=None,
             mounts=None, liveness=None, startup=None, env=None, name="vllm-abc-123", owner="vllm-abc") -> dict:
    container = {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                 "resources": {"limits": {"nvidia.com/gpu": gpus, "memory": memory}}}
    if command is not None:
        container["command"] = command
    if args is not None:
        container["args"] = args
    if mounts:
        container["volumeMounts"] = mounts
    if liveness:
        container["livenessProbe"] = liveness
    if startup:
        container["startupProbe"] = startup
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "inference",
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner,
                                          "controller": True, "uid": "u"}]},
        "spec": {"nodeName": "gpu-node-1", "containers": [container], "volumes": volumes or []},
        "status": {"containerStatuses": [{"name": "vllm", "restartCount": 4, "ready": False,
                                          "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                          "lastState": {"terminated": {"exitCode": exit_code, "reason": reason}}}]},
    }


def make_node(product="NVIDIA-L4", memory_mib=23034, count=1, allocatable_memory="251Gi") -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "gpu-node-1", "labels": {"nvidia.com/gpu.product": product,
                                                          "nvidia.com/gpu.memory": str(memory_mib),
                                                          "nvidia.com/gpu.count": str(count)}},
            "status": {"capacity": {"nvidia.com/gpu": str(count)},
                       "allocatable": {"nvidia.com/gpu": str(count), "memory": allocatable_memory}}}


def require(tool: str, install_hint: str = "") -> str:
    """The path of a tool the test runs as a real process. Outside CI a machine without it
    skips the test; in CI (.ci/run installs every tool) a missing tool fails it."""
    path = shutil.which(tool)
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{tool} is required in CI (.ci/run installs it)")
    pytest.skip(f"{tool} is not installed{f' ({install_hint})' if install_hint else ''}")


def kubeconfig_for(server: str, path: Path) -> str:
    """A kubeconfig file naming `server` (a stand-in's URL, or one nothing listens on), as a
    user's ~/.kube/config would; returns its path."""
    return kubeconfig_with({"stand-in": server}, path)


def kubeconfig_with(servers: dict[str, str], path: Path) -> str:
    """A kubeconfig with one context per entry (context name -> server URL), the first one
    current, as one kubeconfig Secret for several clusters would be; returns its path."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": next(iter(servers)),
        "clusters": [{"name": name, "cluster": {"server": server}} for name, server in servers.items()],
        "users": [{"name": "bot", "user": {"token": "not-a-secret"}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": "bot"}} for name in servers]}))
    return str(path)


def use_kubeconfig(monkeypatch, server: str, folder: Path) -> str:
    """Point `serve`'s kubeconfig lookup (in this process) at `server`. The kubernetes package
    reads KUBECONFIG once, at import, into KUBE_CONFIG_DEFAULT_LOCATION; so set both."""
    from kubernetes.config import kube_config

    path = kubeconfig_for(server, folder / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", path)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", path)
    for var in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(var, raising=False)
    return path
