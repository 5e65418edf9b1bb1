"""Real vLLM pods in the Kubernetes API stand-in: a small kubelet that runs a marked pod's
container as a real process, and a Deployment controller that rolls a template change out.

A container is run for real when its env has REAL_VLLM_ENV (= "1"), as the test's manifest says.
For such a pod `RealKubelet` does what a kubelet does, with real time:
- runs the container's command + args with its env (values only), mapping vLLM's entrypoints to the
  real-vLLM venv's interpreter (`vllm serve M ...` -> `python -m vllm.entrypoints.openai.api_server
  --model M ...`, `python[3] -m vllm...` -> that interpreter), paths under /models/ to the model
  directories it was given (as a volume mount would), and the container's port to a free local one
  (appending --host/--port: a pod's network namespace, here a port per pod);
- its stdout and stderr are the container log (pods/log), read from the process's output file when
  asked (`LiveLogs`); after an exit that log is the `previous` one and the next start's is current;
- an exit is the container's termination: lastState.terminated (exitCode, reason Error or
  Completed; a kill by a probe is SIGKILL, exit 137, reason Error, never OOMKilled), restartCount+1,
  then `waiting: CrashLoopBackOff` for the back-off (base * 2^n, capped; `backoff_base` is short in
  tests), then a restart of the same spec (restartPolicy Always);
- readiness: the readinessProbe if declared, else GET /health on the served port (what every vLLM
  manifest declares); the Ready condition follows it;
- startupProbe / livenessProbe (httpGet, tcpSocket, exec not supported) with initialDelaySeconds,
  periodSeconds, timeoutSeconds, failureThreshold as the kubelet applies them: liveness runs only
  after the startup probe succeeded; failureThreshold consecutive failures SIGKILL the process,
  with the kubelet's "Unhealthy" and "Killing" events;
- the pod proxy reaches the real server (`serve_pod` with the local port while it runs);
- a pod deleted from the store has its process killed.

`RealRollout` is an `on_write` hook: when a Deployment's template changes it creates the new
ReplicaSet and its pod (the kubelet then runs the new spec) and deletes the old ReplicaSet's pods
(strategy Recreate: two real vLLMs on two cores would only slow each other down).
"""

from __future__ import annotations

import copy
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubeapi.objects import start_pod
from kubeapi.server import FakeKube

REAL_VLLM_ENV = "VLLM_STANDIN_REAL"
MODELS_PREFIX = "/models/"
VLLM_MODULE = "vllm.entrypoints.openai.api_server"
# What the real process always gets on top of the container's env: no model hub, the venv's tools.
BASE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1"}


def is_real(container: dict[str, Any]) -> bool:
    return any(e.get("name") == REAL_VLLM_ENV and e.get("value") == "1" for e in container.get("env") or [])


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Probe:
    """One probe of a container spec, with the kubelet's defaults."""

    path: str | None  # httpGet path; None: tcpSocket
    initial_delay: float
    period: float
    timeout: float
    failure_threshold: int

    @classmethod
    def of(cls, spec: dict[str, Any] | None) -> Probe | None:
        if not spec:
            return None
        http_get = spec.get("httpGet")
        if not http_get and not spec.get("tcpSocket"):
            raise ValueError(f"only httpGet and tcpSocket probes are supported here: {spec}")
        return cls(path=(http_get or {}).get("path", "/") if http_get else None,
                   initial_delay=float(spec.get("initialDelaySeconds", 0)), period=float(spec.get("periodSeconds", 10)),
                   timeout=float(spec.get("timeoutSeconds", 1)), failure_threshold=int(spec.get("failureThreshold", 3)))

    def passes(self, port: int) -> bool:
        if self.path is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=self.timeout):
                    return True
            except OSError:
                return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{self.path}", timeout=self.timeout) as answer:
                return 200 <= answer.status < 400
        except (urllib.error.URLError, OSError, TimeoutError):
            return False


@dataclass
class Termination:
    exit_code: int
    reason: str
    started: str
    finished: str
    message: str = ""
    # Which probe killed it (None: it exited by itself or was stopped). Kept with the termination,
    # not only on the running container, because a restart clears the container's own field.
    killed_by: str | None = None


@dataclass
class RealContainer:
    """The running state of one real container (one pod, its first container)."""

    namespace: str
    pod: str
    spec: dict[str, Any]
    restarts: int = 0
    last: Termination | None = None
    prior: Termination | None = None  # the termination before `last`
    proc: subprocess.Popen | None = None
    port: int = 0
    log_path: Path | None = None
    started_at: float = 0.0
    started_iso: str = ""
    ready: bool = False
    started_probe_ok: bool = False
    killed_by: str | None = None
    stopped: bool = False
    runs: list[list[str]] = field(default_factory=list)  # every argv it was started with


_MISSING = object()


class LiveLogs(dict):
    """FakeKube.logs, where a running real container's current log is read from its file at the
    moment pods/log is asked (no copy that lags behind what the process printed)."""

    def __init__(self, logs: dict) -> None:
        super().__init__(logs)
        self.files: dict[tuple[str, str, str, bool], Path] = {}

    def get(self, key: Any, default: Any = None) -> Any:
        path = self.files.get(key)
        if path is not None and path.exists():
            return path.read_bytes().decode("utf-8", errors="replace")
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        found = self.get(key, _MISSING)
        if found is _MISSING:
            raise KeyError(key)
        return found


class RealKubelet:
    def __init__(self, kube: FakeKube, python: str, models: dict[str, str], workdir: Path,
                 backoff_base: float = 2.0, backoff_cap: float = 20.0, tick: float = 0.25):
        if not isinstance(kube.logs, LiveLogs):
            kube.logs = LiveLogs(kube.logs)
        self.live_logs: LiveLogs = kube.logs  # type: ignore[assignment]
        self.kube, self.python, self.models, self.workdir = kube, python, models, Path(workdir)
        self.backoff_base, self.backoff_cap, self.tick = backoff_base, backoff_cap, tick
        self.containers: dict[tuple[str, str], RealContainer] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._sync_loop, name="real-kubelet", daemon=True)
        self.workdir.mkdir(parents=True, exist_ok=True)

    def start(self) -> RealKubelet:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        with self.lock:
            containers = list(self.containers.values())
        for c in containers:
            c.stopped = True
            self._kill(c)
        self.thread.join(10)

    # -- the sync loop: new marked pods get a worker, deleted pods lose theirs
    def _sync_loop(self) -> None:
        while not self.stopping.wait(self.tick):
            pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in self.kube.list("Pod")}
            with self.lock:
                for key, pod in pods.items():
                    spec = ((pod.get("spec") or {}).get("containers") or [{}])[0]
                    if key not in self.containers and is_real(spec):
                        c = RealContainer(key[0], key[1], copy.deepcopy(spec))
                        self.containers[key] = c
                        threading.Thread(target=self._run, args=(c,), name=f"pod-{key[1]}", daemon=True).start()
                for key, c in self.containers.items():
                    if key not in pods and not c.stopped:
                        c.stopped = True
                        self._kill(c)

    # -- one container's life: start, probe, exit, back off, start again
    def _run(self, c: RealContainer) -> None:
        while not c.stopped and not self.stopping.is_set():
            self._start(c)
            self._supervise(c)
            if c.stopped:
                return
            delay = min(self.backoff_cap, self.backoff_base * 2 ** max(0, c.restarts - 1))
            self._status(c, waiting=("CrashLoopBackOff", f"back-off {delay:g}s restarting failed "
                                     f"container={c.spec['name']} pod={c.pod}_{c.namespace}"))
            self._event(c, "BackOff", f"Back-off restarting failed container {c.spec['name']} in pod {c.pod}")
            if self.stopping.wait(delay):
                return

    def argv(self, spec: dict[str, Any], port: int) -> list[str]:
        """The container's command line as this machine runs it (see the module docstring)."""
        words = [*(spec.get("command") or []), *(spec.get("args") or [])]
        if not words:
            raise ValueError("a real vLLM container needs a command (the image's entrypoint is not known here)")
        if words[0] == "vllm" and words[1:2] == ["serve"]:
            rest = words[2:]
            if rest and not rest[0].startswith("-"):
                rest = ["--model", rest[0], *rest[1:]]
            words = [self.python, "-m", VLLM_MODULE, *rest]
        elif Path(words[0]).name.startswith("python") and words[1:2] == ["-m"]:
            words = [self.python, *words[1:]]
        words = [self._model_path(w) for w in words]
        return [*words, "--host", "127.0.0.1", "--port", str(port)]

    def _model_path(self, word: str) -> str:
        for prefix, folder in self.models.items():
            if word == prefix or word.startswith(prefix + "/"):
                return folder + word[len(prefix):]
        return word

    def _start(self, c: RealContainer) -> None:
        c.port = _free_port()
        argv = self.argv(c.spec, c.port)
        env = {"PATH": f"{Path(self.python).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
               "HOME": str(self.workdir), **BASE_ENV,
               **{e["name"]: str(e.get("value", "")) for e in c.spec.get("env") or [] if "value" in e}}
        c.log_path = self.workdir / f"{c.pod}.{c.restarts}.log"
        with c.log_path.open("wb") as out:
            c.proc = subprocess.Popen(argv, env=env, cwd=self.workdir, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        c.runs.append(argv)
        self.live_logs.files[(c.namespace, c.pod, c.spec["name"], False)] = c.log_path
        c.started_at, c.started_iso, c.ready, c.killed_by = time.monotonic(), _now(), False, None
        c.started_probe_ok = False
        self.kube.serve_pod(c.namespace, c.pod, f"http://127.0.0.1:{c.port}")
        self._status(c, running=True)

    def _supervise(self, c: RealContainer) -> None:
        """Probe until the process exits; then record its termination."""
        startup = Probe.of(c.spec.get("startupProbe"))
        liveness = Probe.of(c.spec.get("livenessProbe"))
        readiness = Probe.of(c.spec.get("readinessProbe")) or Probe("/health", 0, 1, 1, 1)
        next_at = {"startup": 0.0, "liveness": 0.0, "readiness": 0.0}
        failures = {"startup": 0, "liveness": 0}
        c.started_probe_ok = startup is None
        assert c.proc is not None
        while c.proc.poll() is None:
            if c.stopped:
                self._kill(c)
                break
            age = time.monotonic() - c.started_at
            for name, probe in (("startup", startup), ("liveness", liveness), ("readiness", readiness)):
                if probe is None or age < probe.initial_delay or time.monotonic() < next_at[name]:
                    continue
                if name != "startup" and not c.started_probe_ok:
                    continue
                if name == "startup" and c.started_probe_ok:
                    continue
                next_at[name] = time.monotonic() + probe.period
                ok = probe.passes(c.port)
                if name == "readiness":
                    if ok != c.ready:
                        c.ready = ok
                        self._status(c, running=True)
                    continue
                if ok:
                    failures[name] = 0
                    if name == "startup":
                        c.started_probe_ok = True
                    continue
                failures[name] += 1
                self._event(c, "Unhealthy", f"{name.capitalize()} probe failed: Get "
                            f"\"http://10.0.0.1:{self._container_port(c)}{probe.path}\": connection refused")
                if failures[name] >= probe.failure_threshold:
                    c.killed_by = name
                    self._event(c, "Killing", f"Container {c.spec['name']} failed {name} probe, will be restarted")
                    self._kill(c)
            time.sleep(self.tick)
        code = c.proc.wait()
        exit_code = 128 - code if code < 0 else code  # killed by a signal: 128 + its number, as the kubelet says
        c.prior = c.last
        c.last = Termination(exit_code, "Completed" if exit_code == 0 else "Error", c.started_iso, _now(),
                             killed_by=c.killed_by)
        c.ready = False
        if c.stopped:
            return
        c.restarts += 1
        self._copy_log(c, previous=True)
        self.live_logs.files.pop((c.namespace, c.pod, c.spec["name"], False), None)
        self.kube.set_log(c.namespace, c.pod, c.spec["name"], "", previous=False)
        with self.kube.lock:
            self.kube.pod_backends.pop((c.namespace, c.pod), None)
        self._status(c, terminated=True)

    def _container_port(self, c: RealContainer) -> int:
        for port in c.spec.get("ports") or []:
            return int(port.get("containerPort", 8000))
        return 8000

    @staticmethod
    def _kill(c: RealContainer) -> None:
        if c.proc is not None and c.proc.poll() is None:
            try:
                os.killpg(c.proc.pid, signal.SIGKILL)  # vLLM's engine core is a child process: the group
            except ProcessLookupError:
                pass

    def _copy_log(self, c: RealContainer, previous: bool) -> None:
        if c.log_path is None:
            return
        text = c.log_path.read_bytes().decode("utf-8", errors="replace")
        self.kube.set_log(c.namespace, c.pod, c.spec["name"], text, previous=previous)

    # -- what the API shows
    def _status(self, c: RealContainer, running: bool = False, terminated: bool = False,
                waiting: tuple[str, str] | None = None) -> None:
        cs: dict[str, Any] = {"name": c.spec["name"], "image": c.spec.get("image", ""), "restartCount": c.restarts,
                              "ready": c.ready and running, "started": running and c.started_probe_ok}
        # Just exited: state.terminated is this exit and lastState the one before; otherwise
        # (running, or waiting in back-off) lastState is the latest exit.
        before = c.prior if terminated else c.last
        if running:
            cs["state"] = {"running": {"startedAt": c.started_iso}}
        elif terminated and c.last is not None:
            cs["state"] = {"terminated": self._terminated(c.last)}
        elif waiting:
            cs["state"] = {"waiting": {"reason": waiting[0], "message": waiting[1]}}
        if before is not None:
            cs["lastState"] = {"terminated": self._terminated(before)}
        ready = "True" if cs["ready"] else "False"

        def update(pod: dict[str, Any]) -> None:
            pod["status"] = {"phase": "Running", "podIP": "10.0.0.1", "startTime": pod.get("status", {}).get(
                "startTime", c.started_iso), "conditions": [{"type": "Ready", "status": ready},
                                                           {"type": "ContainersReady", "status": ready}],
                "containerStatuses": [cs]}

        try:
            self.kube.edit("Pod", c.pod, c.namespace, update)
        except KeyError:  # the pod was deleted meanwhile
            c.stopped = True

    @staticmethod
    def _terminated(t: Termination) -> dict[str, Any]:
        return {"exitCode": t.exit_code, "reason": t.reason, "startedAt": t.started, "finishedAt": t.finished}

    def _event(self, c: RealContainer, reason: str, message: str) -> None:
        self.kube.put({"apiVersion": "v1", "kind": "Event",
                       "metadata": {"name": f"{c.pod}.{uuid.uuid4().hex[:8]}", "namespace": c.namespace},
                       "involvedObject": {"kind": "Pod", "name": c.pod, "namespace": c.namespace},
                       "reason": reason, "message": message, "type": "Warning" if reason != "Pulled" else "Normal",
                       "lastTimestamp": _now(), "count": 1})

    # -- for the tests
    def container(self, pod: str, namespace: str = "inference") -> RealContainer | None:
        with self.lock:
            return self.containers.get((namespace, pod))

    def all_containers(self) -> list[RealContainer]:
        with self.lock:
            return list(self.containers.values())


class RealRollout:
    """on_write hook: a Deployment template change -> a new ReplicaSet and pod; the old pods go."""

    def __init__(self) -> None:
        self.rollouts = 0

    def __call__(self, fake: FakeKube, new: dict[str, Any], old: dict[str, Any] | None) -> None:
        if new.get("kind") != "Deployment" or old is None or new["spec"]["template"] == old["spec"]["template"]:
            return
        ns, name = new["metadata"]["namespace"], new["metadata"]["name"]
        for pod in fake.list("Pod", ns):
            owners = (pod.get("metadata") or {}).get("ownerReferences") or []
            if any(o.get("kind") == "ReplicaSet" and o.get("name", "").startswith(name + "-") for o in owners):
                fake.delete("Pod", pod["metadata"]["name"], ns)
        self.rollouts += 1
        start_pod(fake, new, "starting", suffix=f"r{self.rollouts}{uuid.uuid4().hex[:3]}")
