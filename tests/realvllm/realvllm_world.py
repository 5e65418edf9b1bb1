"""The world of the real-vLLM scenarios: stand-ins (the Kubernetes API with a real kubelet, Slack)
around one `vllm-oncall serve` process with the pod watch on, and the CPU vLLM container they run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from builders import free_port, http, wait_for
from kubeapi.realpod import RealKubelet, RealRollout
from kubeapi.server import FakeKube
from slackapi import SlackStandIn
from slackapi.requests import button_value, click_body, signed_headers

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("VLLM_ONCALL_VLLM_PYTHON") or ROOT / ".vllm-venv" / "bin" / "python")
MODELS_CACHE = Path(os.environ.get("VLLM_ONCALL_MODELS_CACHE") or ROOT / ".cache" / "realvllm-models")
FIXTURES = ROOT / "tests" / "fixtures" / "realvllm"
NS, CHANNEL, APPROVER, SECRET = "inference", "C0ALERTS", "U0APPROVER", "realvllm-signing-secret"


def vllm_container(args: list[str], env: dict[str, str] | None = None, model: str = "serving",
                   **extra) -> dict:
    """A CPU vLLM 0.32 container: the tiny model, small settings so one start fits two cores."""
    base_env = {"VLLM_STANDIN_REAL": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1",
                "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    return {"name": "vllm", "image": "vllm/vllm-openai-cpu:v0.32.0",
            "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
            "args": ["--model", f"/models/tiny-llama-{model}", "--served-model-name", "tiny-llama", *args],
            "env": [{"name": k, "value": v} for k, v in {**base_env, **(env or {})}.items()],
            "ports": [{"containerPort": 8000, "name": "http"}],
            "resources": {"limits": {"cpu": "2", "memory": "8Gi"}, "requests": {"cpu": "2", "memory": "8Gi"}},
            **extra}


CPU_NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-1", "labels": {"kubernetes.io/os": "linux"}},
            "status": {"capacity": {"cpu": "2", "memory": "23Gi"}, "allocatable": {"cpu": "2", "memory": "22Gi"}}}


class Bot:
    """One `vllm-oncall serve` process with the pod watch on."""

    def __init__(self, env: dict[str, str], folder: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = folder / "bot.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "bot.cli", "serve"],
                                         env={**env, "VLLM_ONCALL_ALERTS_UNAUTHENTICATED": "true", "VLLM_ONCALL_LISTEN": f"127.0.0.1:{self.port}"},
                                         cwd=folder, stdout=out, stderr=subprocess.STDOUT, text=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class World:
    def __init__(self, folder: Path, vllm_python: str, models: dict[str, str], **settings: str):
        self.folder = folder
        self.kube, self.slack = FakeKube().start(), SlackStandIn().start()
        self.kubelet = RealKubelet(self.kube, vllm_python, models, folder / "node").start()
        self.kube.on_write = RealRollout()
        self.kube.put(CPU_NODE)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_SERVICE", "VLLM_ONCALL_"))}
        self.env = {**env, "KUBECONFIG": str(self.kube.write_kubeconfig(folder / "kubeconfig")),
                    "PYTHONPATH": str(ROOT), "VLLM_ONCALL_CLUSTER": "realvllm", "SLACK_BOT_TOKEN": "xoxb-real",
                    "SLACK_SIGNING_SECRET": SECRET, "SLACK_API_URL": self.slack.url,
                    "VLLM_ONCALL_SLACK_CHANNEL": CHANNEL, "VLLM_ONCALL_APPROVERS": APPROVER,
                    "VLLM_ONCALL_STORE": "kube", "VLLM_ONCALL_INCIDENT_NAMESPACE": "vllm-oncall",
                    "VLLM_ONCALL_DEFAULT_NAMESPACE": NS, "VLLM_ONCALL_WATCH": "true",
                    "VLLM_ONCALL_WATCH_NAMESPACES": NS, "VLLM_ONCALL_VERIFY_TIMEOUT_SECONDS": "420",
                    "VLLM_ONCALL_VERIFY_SOAK_SECONDS": "5", "VLLM_ONCALL_VERIFY_REQUEST_TIMEOUT_SECONDS": "60",
                    "VLLM_ONCALL_SWEEP_INTERVAL_SECONDS": "1", **settings}
        dists = sorted(Path(vllm_python).parent.parent.glob("lib/python*/site-packages/vllm_cpu-*.dist-info"))
        self.vllm_version = dists[0].name.removesuffix(".dist-info").split("-")[1] if dists else "unknown"
        self.bot = Bot(self.env, folder)
        self.started = time.monotonic()
        ok = wait_for(lambda: self.bot.proc.poll() is None and http(self.bot.url + "/readyz")[0] == 200, 60, 0.2)
        assert ok, f"serve never became ready:\n{self.bot.log.read_text()[-3000:]}"
        assert self.kube.wait_for_watchers(1, timeout=30), "serve never opened the pod watch"

    def stop(self) -> None:
        self.bot.stop()
        self.kubelet.stop()
        self.slack.stop()
        self.kube.stop()

    # ---- the cluster
    def deploy(self, name: str, container: dict) -> dict:
        from kubeapi.objects import deployment, start_pod

        dep = self.kube.put(deployment(name, [container], NS))
        start_pod(self.kube, dep, "starting", suffix="first")
        return dep

    def first(self):
        """The real container of the pod deployed first (the one that crashes)."""
        (c,) = [c for c in self.kubelet.all_containers() if c.pod.endswith("-first")]
        return c

    def newest(self):
        """The real container of the rollout's pod (the fix)."""
        found = [c for c in self.kubelet.all_containers() if not c.pod.endswith("-first")]
        assert len(found) == 1, f"expected one new pod, got {[c.pod for c in found]}:\n{self.logs()}"
        return found[0]

    def snapshot(self, pod: str) -> dict:
        """The pod and its events as the API shows them now (the crash's evidence, before a rollout
        deletes the pod)."""
        return {"pod": self.kube.get("Pod", pod, NS),
                "events": [e for e in self.kube.list("Event", NS) if e["involvedObject"]["name"] == pod]}

    def live_container(self, name: str) -> dict:
        return self.kube.get("Deployment", name, NS)["spec"]["template"]["spec"]["containers"][0]

    # ---- Slack
    def wait_post(self, timeout: float) -> dict:
        assert self.slack.wait_for(lambda: len(self.slack.posts()) >= 1, timeout), \
            f"no incident was posted in {timeout:g} s:\n{self.logs()}"
        time.sleep(1)  # the post's follow-up calls (the record's ts) land
        return self.slack.posts()[0].params

    def text_of(self, params: dict) -> str:
        return json.dumps(params)

    def approve(self, post: dict) -> None:
        value = button_value(self.slack.posts()[0], "vllm_approve")
        assert value, f"the incident has no Approve button:\n{json.dumps(post)[:3000]}"
        body = click_body("vllm_approve", value, APPROVER, self.record()["slack_ts"], CHANNEL)
        headers = {k: v[0] for k, v in signed_headers(body, SECRET).items()}
        assert http(self.bot.url + "/slack/events", body.encode(), headers)[0] == 200

    def record(self) -> dict:
        objs = self.kube.list("VLLMIncident", "vllm-oncall")
        if not objs:
            return {}
        obj = objs[0]
        return {**json.loads(obj["spec"]["record"]), "name": obj["metadata"]["name"], "state": obj["spec"]["state"]}

    def wait_state(self, states: set[str], timeout: float) -> str:
        ok = wait_for(lambda: self.record().get("state") in states, timeout, 0.5)
        assert ok, f"the incident stayed {self.record().get('state')}:\n{self.logs()}"
        time.sleep(1.5)  # the last replies land
        return self.record()["state"]

    def replies(self) -> list[str]:
        return [c.params.get("text", "") for c in self.slack.replies()]

    def logs(self) -> str:
        pods = "\n".join(f"--- pod {c.pod} (restarts {c.restarts}, last {c.last}):\n"
                         f"{(c.log_path.read_text(errors='replace')[-2500:] if c.log_path else '')}"
                         for c in self.kubelet.all_containers())
        return f"--- bot\n{self.bot.log.read_text()[-5000:]}\n{pods}\n--- replies\n" + "\n".join(self.replies())



def run_log(container, run: int = 0) -> str:
    """The log of a real container's `run`-th start (0: the first), as the kubelet kept it."""
    path = container.log_path.with_name(f"{container.pod}.{run}.log") if container.log_path else None
    return path.read_text(errors="replace") if path and path.exists() else ""
