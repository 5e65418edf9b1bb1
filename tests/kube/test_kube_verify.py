"""Verification after a change: follow the rollout to a Ready pod (vLLM's KV-cache figures) or a new crash
(diagnosed again). The stand-in plays the Deployment controller through its on_write hook."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubeapi.objects import container, crashing_deployment, rollout_controller

from bot.app.verdict import kv_figures
from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.models import Change, DiagnosisResult
from bot.kube.api import KubeApi
from bot.kube.live import LiveCluster
from bot.kube.retry import RetryPolicy

NS = "inference"
READY_LOG = """\
INFO 11-30 05:10:01 [gpu_worker.py:298] Available KV cache memory: 10.55 GiB
INFO 11-30 05:10:01 [kv_cache_utils.py:1087] GPU KV cache size: 86,432 tokens
INFO 11-30 05:10:01 [kv_cache_utils.py:1091] Maximum concurrency for 8,192 tokens per request: 10.55x
INFO 11-30 05:10:30 [api_server.py:1] Starting vLLM API server on http://0.0.0.0:8000
"""


@pytest.fixture
def cluster(kube_api):
    api = KubeApi(kube_api.api_client(), retry=RetryPolicy(initial=0.001, maximum=0.002, sleep=lambda s: None))
    return LiveCluster(api, name="test-cluster", poll_seconds=0.001, diagnose=diagnose)


def apply_max_len(cluster, pod, after="8192"):
    evidence = cluster.collect(NS, pod["metadata"]["name"])
    change = Change(kind="flag", name="--max-model-len", before="32768", after=after)
    proposal = cluster.propose(DiagnosisResult(cause="kv-cache-max-model-len", title="t", explanation="e",
                                               changes=[change]), evidence, cluster.workload_for(evidence))
    result = cluster.apply(proposal, "U_ALICE")
    assert result.ok, result.message
    return result.workload


def test_new_pod_ready_reports_vllm_kv_cache_figures(kube_api, cluster):
    _, pod = crashing_deployment(kube_api, containers=[container(args=["--model", "m", "--max-model-len", "32768"])])
    kube_api.on_write = rollout_controller("ready", log=READY_LOG)
    workload = apply_max_len(cluster, pod)

    verification = cluster.verify(workload, timeout_seconds=30)

    assert verification.outcome == "ready"
    assert verification.pod.endswith("-newpd") and verification.pod != pod["metadata"]["name"]
    assert verification.kv_cache_line == "GPU KV cache size: 86,432 tokens; Available KV cache memory: 10.55 GiB"
    assert verification.concurrency_line == "Maximum concurrency for 8,192 tokens per request: 10.55x"
    assert "ReplicaSet llama-" in verification.message and "86,432 tokens" in verification.message


def test_new_pod_crashing_again_is_diagnosed_again(kube_api, cluster):
    crash_log = Path(__file__).resolve().parents[2] / "examples" / "incident" / "bundle" / "previous.log"
    _, pod = crashing_deployment(kube_api, containers=[container(
        command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
        args=["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"])], previous_log="first crash\n")
    kube_api.on_write = rollout_controller("crashloop", previous_log=crash_log.read_text())
    workload = apply_max_len(cluster, pod, after="30000")

    verification = cluster.verify(workload, timeout_seconds=30)

    assert verification.outcome == "crashed"
    assert verification.pod.endswith("-newpd")
    assert verification.diagnosis is not None and verification.diagnosis.cause is not None
    assert verification.diagnosis.title in verification.message


def test_second_crash_uses_the_injected_diagnoser(kube_api):
    seen = []

    def fake_diagnose(evidence):
        seen.append(evidence)
        return DiagnosisResult(cause="cuda-graph-capture", title="CUDA graphs", explanation="again")

    api = KubeApi(kube_api.api_client(), retry=RetryPolicy(sleep=lambda s: None))
    cluster = LiveCluster(api, poll_seconds=0.001, diagnose=fake_diagnose)
    _, pod = crashing_deployment(kube_api, containers=[container(args=["--model", "m", "--max-model-len", "32768"])])
    kube_api.on_write = rollout_controller("crashloop", previous_log="RuntimeError: CUDA error: out of memory\n")
    verification = cluster.verify(apply_max_len(cluster, pod), timeout_seconds=30)
    assert verification.outcome == "crashed" and verification.diagnosis.cause == "cuda-graph-capture"
    assert seen[0].log.text == "RuntimeError: CUDA error: out of memory\n"
    assert seen[0].pod["metadata"]["name"].endswith("-newpd")


def test_no_new_pod_times_out(kube_api, cluster):
    _, pod = crashing_deployment(kube_api, containers=[container(args=["--model", "m", "--max-model-len", "32768"])])
    workload = apply_max_len(cluster, pod)  # no controller hook: nothing rolls out
    verification = cluster.verify(workload, timeout_seconds=0)
    assert verification.outcome == "timeout" and "many minutes" in verification.message


@pytest.mark.parametrize("text, kv, conc", [
    ("INFO 08-19 [llm_engine.py:275] # GPU blocks: 1478, # CPU blocks: 2048\n"
     "INFO Maximum concurrency for 29000 tokens per request: 0.82x\n",
     "# GPU blocks: 1478", "Maximum concurrency for 29000 tokens per request: 0.82x"),
    ("INFO [executor_base.py:111] # cuda blocks: 12345, # CPU blocks: 2048\n", "# cuda blocks: 12345", None),
    ("(EngineCore pid=1) INFO [kv_cache_utils.py:1870] GPU KV cache size: 1,048,576 tokens, Maximum concurrency "
     "for 32,768 tokens per request: 32.00x\n", "GPU KV cache size: 1,048,576 tokens",
     "Maximum concurrency for 32,768 tokens per request: 32.00x"),
    ("nothing useful\n", None, None),
])
def test_kv_figures_across_vllm_versions(text, kv, conc):
    assert kv_figures(text) == (kv, conc)


def test_timeout_says_why_the_new_pod_is_not_running(kube_api, cluster):
    """A GPU limit raised beyond what any node has: the new pod stays Pending, and the message says so."""
    _, pod = crashing_deployment(kube_api, containers=[container(args=["--model", "m", "--max-model-len", "32768"])])
    kube_api.on_write = rollout_controller("starting")
    workload = apply_max_len(cluster, pod)
    new = next(p for p in kube_api.list("Pod", NS) if p["metadata"]["name"].endswith("-newpd"))
    kube_api.edit("Pod", new["metadata"]["name"], NS, lambda p: p.update(status={
        "phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]}))
    verification = cluster.verify(workload, timeout_seconds=0)
    assert verification.outcome == "timeout"
    assert "not scheduled: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu." in verification.message


def test_statefulset_rollout_is_followed_by_update_revision(kube_api, cluster):
    from kubeapi.objects import deployment, start_pod

    sts = deployment("qwen", [container(args=["--model", "q", "--max-model-len", "32768"])], NS)
    sts["kind"], sts["spec"]["serviceName"] = "StatefulSet", "qwen"
    sts = kube_api.put(sts)
    old = start_pod(kube_api, sts, "crashloop", previous_log="boom\n", suffix="0")
    kube_api.edit("Pod", old["metadata"]["name"], NS, lambda p: p["metadata"]["labels"].update(
        {"controller-revision-hash": "qwen-rev1"}))
    workload = apply_max_len(cluster, old)
    # The StatefulSet controller re-creates pod 0 from the new revision; a webhook adds an env var to it.
    kube_api.delete("Pod", old["metadata"]["name"], NS)
    new = start_pod(kube_api, kube_api.get("StatefulSet", "qwen", NS), "ready", log=READY_LOG, suffix="0")
    kube_api.edit("Pod", new["metadata"]["name"], NS, lambda p: (
        p["metadata"]["labels"].update({"controller-revision-hash": "qwen-rev2"}),
        p["spec"]["containers"][0].setdefault("env", []).append({"name": "AWS_ROLE_ARN", "value": "arn:x"})))
    kube_api.edit("StatefulSet", "qwen", NS, lambda o: o.setdefault("status", {}).update(
        {"updateRevision": "qwen-rev2", "currentRevision": "qwen-rev1"}))

    verification = cluster.verify(workload, timeout_seconds=5)

    assert verification.outcome == "ready" and verification.pod == "qwen-0"
    assert verification.kv_cache_line.startswith("GPU KV cache size: 86,432 tokens")


@pytest.mark.parametrize("actual, expected, ok", [
    ({"args": ["a"], "env": [{"name": "A", "value": "1"}, {"name": "INJECTED", "value": "x"}]},
     {"args": ["a"], "env": [{"name": "A", "value": "1"}]}, True),  # a webhook's extra env var is fine
    ({"args": ["a", "b"]}, {"args": ["a"]}, False),  # different command line: not the new template
    ({"resources": {"limits": {"memory": "48Gi"}}}, {"resources": {"limits": {"memory": "32Gi"}}}, False),
])
def test_pod_contains_the_template_fields(actual, expected, ok):
    from bot.kube.verify import contains

    assert contains(actual, expected) is ok
