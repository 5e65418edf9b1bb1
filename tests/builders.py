"""Builders for test evidence: bundles on disk, pods and nodes as the API returns them, and where
the repository, the shared corpus and our fixture bundles are."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from standin_http import bound

ROOT = Path(__file__).resolve().parents[1]
SHARED_CORPUS = ROOT.parent / "shared" / "corpus"
FIXTURE_BUNDLES = ROOT / "tests" / "fixtures" / "bundles"
EXAMPLE = ROOT / "examples" / "incident"
EXAMPLE_BUNDLE = EXAMPLE / "bundle"
EXAMPLE_LOG = (EXAMPLE_BUNDLE / "previous.log").read_text()  # the bundled crash: the KV cache does not fit
# What a fixed pod's vLLM prints: the KV-cache and concurrency lines verification reads, then the API server.
NEW_POD_LOG = """\
INFO 11-30 05:20:01 [gpu_worker.py:298] Available KV cache memory: 10.55 GiB
INFO 11-30 05:20:01 [kv_cache_utils.py:1087] GPU KV cache size: 86,432 tokens
INFO 11-30 05:20:01 [kv_cache_utils.py:1091] Maximum concurrency for 18,432 tokens per request: 4.69x
INFO 11-30 05:20:40 [api_server.py:1971] Starting vLLM API server 0 on http://0.0.0.0:8000
"""


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


# ---- for tests that run the bot as a server or a process ---------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """(status, text) of a GET (or a POST with `body`); (0, "") when nothing answers."""
    req = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def wait_for(predicate, timeout: float, step: float = 0.02) -> bool:
    """Poll until `predicate()` holds; returns whether it held. `timeout` only bounds a failure
    (stretched to standin_http.FAILURE_BOUND, so a loaded machine is not one)."""
    deadline = time.monotonic() + bound(timeout)
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


class TrackedExecutor(ThreadPoolExecutor):
    """A thread pool that knows when all it was given has run: hand it to what runs work in the
    background (Bolt's listeners: `build_app(..., listener_executor=...)`) and `wait_idle()`
    instead of sleeping until things look settled."""

    def __init__(self, max_workers: int = 5):
        super().__init__(max_workers=max_workers, thread_name_prefix="tracked")
        self._pending = 0
        self._idle = threading.Condition()

    def submit(self, fn, /, *args, **kwargs):
        with self._idle:
            self._pending += 1
        future = super().submit(fn, *args, **kwargs)
        future.add_done_callback(self._done)
        return future

    def _done(self, _future) -> None:
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()

    def wait_idle(self, timeout: float = 60) -> None:
        """Until every submitted task has finished; `timeout` only bounds a failure."""
        with self._idle:
            if not self._idle.wait_for(lambda: self._pending == 0, timeout):
                raise AssertionError(f"background work still running after {timeout} s")
