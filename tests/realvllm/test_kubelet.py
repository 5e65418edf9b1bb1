"""The real-pod kubelet (tests/kubeapi/realpod.py) on a stand-in process, in every run: logs and
--previous, exit codes and restarts with back-off, readiness from /health, a liveness kill (137,
not OOMKilled), a rollout running the new spec. The real vLLM scenarios build on these."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from builders import wait_for
from kubeapi.objects import deployment, start_pod
from kubeapi.realpod import RealKubelet, RealRollout

pytestmark = pytest.mark.integration
SCRIPT = str(Path(__file__).with_name("fake_server.py"))


def _container(env: dict[str, str], **extra) -> dict:
    return {"name": "vllm", "image": "vllm/vllm-openai:v0.32.0", "command": ["python3", SCRIPT],
            "args": ["--model", "/models/m"],
            "env": [{"name": "VLLM_STANDIN_REAL", "value": "1"}, *({"name": k, "value": v} for k, v in env.items())],
            "ports": [{"containerPort": 8000}], **extra}


@pytest.fixture
def kubelet(kube_api, tmp_path):
    k = RealKubelet(kube_api, sys.executable, {"/models": str(tmp_path / "models")}, tmp_path / "node",
                    backoff_base=0.5, backoff_cap=1, tick=0.05).start()
    kube_api.on_write = RealRollout()
    yield k
    k.stop()


def _status(kube_api, pod: str) -> dict:
    return kube_api.get("Pod", pod, "inference")["status"]["containerStatuses"][0]


def test_an_exit_is_the_containers_termination_and_its_output_the_previous_log(kube_api, kubelet, tmp_path):
    dep = kube_api.put(deployment("crash", [_container({"EXIT_CODE": "3", "MARK": "one"})]))
    pod = start_pod(kube_api, dep, "starting", suffix="first")["metadata"]["name"]
    assert wait_for(lambda: _status(kube_api, pod)["restartCount"] >= 2, 20, 0.05)
    status = _status(kube_api, pod)
    assert status["lastState"]["terminated"]["exitCode"] == 3
    assert status["lastState"]["terminated"]["reason"] == "Error"
    previous = kube_api.logs[("inference", pod, "vllm", True)]
    assert f"starting --model {tmp_path / 'models'}/m --host 127.0.0.1 --port" in previous, previous
    assert "MARK=one" in previous and "fatal: exiting" in previous
    reasons = {e["reason"] for e in kube_api.list("Event", "inference")}
    assert "BackOff" in reasons


def test_health_drives_readiness_and_the_pod_proxy_reaches_the_process(kube_api, kubelet):
    dep = kube_api.put(deployment("ok", [_container({"START_DELAY": "0.5"})]))
    pod = start_pod(kube_api, dep, "starting", suffix="first")["metadata"]["name"]
    assert wait_for(lambda: _status(kube_api, pod)["ready"], 20, 0.05)
    conditions = kube_api.get("Pod", pod, "inference")["status"]["conditions"]
    assert {"type": "Ready", "status": "True"} in conditions
    assert kube_api.pod_backends[("inference", pod)] == f"http://127.0.0.1:{kubelet.container(pod).port}"
    assert "serving" in kube_api.logs[("inference", pod, "vllm", False)]


def test_a_failing_liveness_probe_kills_the_process_with_137_not_oomkilled(kube_api, kubelet):
    probe = {"httpGet": {"path": "/health", "port": 8000}, "initialDelaySeconds": 0.2, "periodSeconds": 0.2,
             "failureThreshold": 2}
    dep = kube_api.put(deployment("slow", [_container({"START_DELAY": "30"}, livenessProbe=probe)]))
    pod = start_pod(kube_api, dep, "starting", suffix="first")["metadata"]["name"]
    assert wait_for(lambda: _status(kube_api, pod)["restartCount"] >= 1, 20, 0.05)
    assert wait_for(lambda: "lastState" in _status(kube_api, pod), 5, 0.05)
    last = _status(kube_api, pod)["lastState"]["terminated"]
    assert (last["exitCode"], last["reason"]) == (137, "Error")
    messages = [e["message"] for e in kube_api.list("Event", "inference") if e["reason"] == "Killing"]
    assert messages and "failed liveness probe" in messages[0]


def test_a_template_change_runs_the_new_spec_in_a_new_pod_and_stops_the_old(kube_api, kubelet):
    dep = kube_api.put(deployment("roll", [_container({"EXIT_CODE": "1", "MARK": "old"})]))
    old = start_pod(kube_api, dep, "starting", suffix="first")["metadata"]["name"]
    assert wait_for(lambda: _status(kube_api, old)["restartCount"] >= 1, 20, 0.05)

    def fix(d: dict) -> None:
        d["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "VLLM_STANDIN_REAL", "value": "1"},
                                                                 {"name": "MARK", "value": "new"}]

    new_dep = kube_api.edit("Deployment", "roll", "inference", fix)
    kube_api.on_write(kube_api, new_dep, dep)
    assert kube_api.get("Pod", old, "inference") is None
    (new,) = [p["metadata"]["name"] for p in kube_api.list("Pod", "inference")]
    assert wait_for(lambda: _status(kube_api, new)["ready"], 20, 0.05)
    assert "MARK=new" in kube_api.logs[("inference", new, "vllm", False)]
    assert wait_for(lambda: kubelet.container(old).proc.poll() is not None, 5, 0.05)
