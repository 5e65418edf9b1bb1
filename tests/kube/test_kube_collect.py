"""Evidence from the API (real kubernetes client against the local API stand-in), errors and retries."""

from __future__ import annotations

import json

import pytest
from builders import kubeconfig_for
from kubeapi.objects import container, crashing_deployment, start_pod

from bot.kube.api import KubeApi
from bot.kube.collect import GPU_PODS_ANNOTATION, MIDDLE_MARKER, events_can_explain
from bot.kube.errors import KubeForbidden, KubeUnavailable, PodGone
from bot.kube.live import LiveCluster
from bot.kube.retry import RetryPolicy

NS = "inference"


class RecordedSleeps(list):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def sleeps():
    return RecordedSleeps()


@pytest.fixture
def cluster(kube_api, sleeps):
    api = KubeApi(kube_api.api_client(), retry=RetryPolicy(initial=0.001, maximum=0.002, jitter=0.001, sleep=sleeps))
    return LiveCluster(api, name="test-cluster", poll_seconds=0.001)


def test_collect_for_a_bundle_reads_pod_previous_log_events_node_and_gpu_neighbours(kube_api, cluster):
    dep, pod = crashing_deployment(kube_api, previous_log="INFO engine config\nValueError: boom\n")
    other = start_pod(kube_api, crashing_deployment(kube_api, name="other", events=False)[0], "ready", suffix="zzz")
    cpu_only = dict(other)
    kube_api.put({"apiVersion": "v1", "kind": "Pod",
                  "metadata": {"name": "cpu-job", "namespace": "batch"},
                  "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "c", "image": "busybox"}]},
                  "status": {"phase": "Running"}})
    evidence = cluster.collect(NS, pod["metadata"]["name"], gpu_pods=True)  # as `vllm-oncall collect` does

    assert evidence.log.text == "INFO engine config\nValueError: boom\n"
    assert evidence.log.truncated_middle is False
    assert evidence.container == "vllm"
    assert evidence.source == f"{NS}/{pod['metadata']['name']}"
    assert evidence.pod["metadata"]["name"] == pod["metadata"]["name"]
    assert [e["reason"] for e in evidence.events] == ["BackOff", "Killing"]
    assert evidence.node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A10G"
    gpu_pods = json.loads(evidence.node["metadata"]["annotations"][GPU_PODS_ANNOTATION])
    names = [g["pod"] for g in gpu_pods]
    assert f"{NS}/{cpu_only['metadata']['name']}" in names  # the other vLLM pod holds a GPU
    assert f"{NS}/{pod['metadata']['name']}" not in names and "batch/cpu-job" not in names
    log_calls = [c for c in kube_api.calls if c.resource == "pods/log"]
    assert log_calls[0].query["previous"] == "true" and log_calls[0].query["container"] == "vllm"


def test_large_log_keeps_head_and_tail_and_marks_the_middle(kube_api, sleeps):
    head = "INFO 01-01 00:00:00 [config.py:1] Initializing a V1 LLM engine with config: max_seq_len=32768\n"
    middle = "".join(f"INFO loading shard {i} of 100000\n" for i in range(100_000))
    tail = "ValueError: To serve at least one request with the models's max seq len (32768) ...\n"
    _, pod = crashing_deployment(kube_api, previous_log=head + middle + tail)
    api = KubeApi(kube_api.api_client(), retry=RetryPolicy(sleep=sleeps))
    cluster = LiveCluster(api, head_bytes=4096, tail_lines=50)

    evidence = cluster.collect(NS, pod["metadata"]["name"])

    text = evidence.log.text
    assert evidence.log.truncated_middle is True
    assert text.startswith(head)
    assert text.endswith("INFO loading shard 99999 of 100000\n" + tail)
    assert MIDDLE_MARKER in text
    assert len(text) < 4096 + 50 * 60 + 200  # head + 50 lines, not 3 MB
    log_calls = [c.query for c in kube_api.calls if c.resource == "pods/log"]
    assert log_calls[0]["limitBytes"] == "4097" and log_calls[1]["tailLines"] == "50"
    assert all(q["previous"] == "true" for q in log_calls)


def test_log_just_over_head_size_joins_without_duplicate_lines(kube_api):
    lines = [f"line {i:04d}\n" for i in range(300)]
    _, pod = crashing_deployment(kube_api, previous_log="".join(lines))
    cluster = LiveCluster(KubeApi(kube_api.api_client()), head_bytes=2000, tail_lines=250)
    evidence = cluster.collect(NS, pod["metadata"]["name"])
    assert evidence.log.text == "".join(lines)
    assert evidence.log.truncated_middle is False


def test_previous_log_gone_uses_current_log_and_says_so(kube_api, cluster):
    _, pod = crashing_deployment(kube_api)
    name = pod["metadata"]["name"]
    del kube_api.logs[(NS, name, "vllm", True)]
    kube_api.set_log(NS, name, "vllm", "INFO current container is loading\n", previous=False)

    evidence = cluster.collect(NS, name)

    assert evidence.log.text == "INFO current container is loading\n"
    notes = [e for e in evidence.events if e["reason"] == "VllmOncallNote"]
    assert len(notes) == 1 and "previous container's log is no longer available" in notes[0]["message"]
    assert 'previous terminated container "vllm"' in notes[0]["message"]


def test_pod_not_found_names_close_matches_and_newest_pod_of_the_workload(kube_api, cluster):
    dep, pod = crashing_deployment(kube_api)
    newer = start_pod(kube_api, dep, "crashloop", suffix="q7x2z")
    gone = pod["metadata"]["name"][:-5] + "aaaaa"

    with pytest.raises(PodGone) as info:
        cluster.collect(NS, gone)

    assert info.value.newest_of_workload == newer["metadata"]["name"]
    assert info.value.close_matches[0] == newer["metadata"]["name"]
    assert pod["metadata"]["name"] in info.value.close_matches
    assert "newest pod of the same workload" in str(info.value)


def test_resolve_pod_accepts_a_deployment_name(kube_api, cluster):
    dep, pod = crashing_deployment(kube_api)
    start_pod(kube_api, dep, "ready", suffix="ready")
    assert cluster.resolve_pod(NS, "llama") == pod["metadata"]["name"]  # the crashing one, not the ready one
    assert cluster.resolve_pod(NS, pod["metadata"]["name"]) == pod["metadata"]["name"]


def test_403_names_the_verb_and_resource_the_account_lacks(kube_api, cluster):
    _, pod = crashing_deployment(kube_api)
    kube_api.fail("get", "pods/log", 403)
    with pytest.raises(KubeForbidden) as info:
        cluster.collect(NS, pod["metadata"]["name"])
    message = str(info.value)
    assert info.value.verb == "get" and info.value.resource == "pods/log"
    assert "may not get pods/log in namespace inference" in message
    assert "cannot get resource" in message  # the API's own words are kept


def test_forbidden_node_read_degrades_to_a_note(kube_api, cluster):
    _, pod = crashing_deployment(kube_api)
    kube_api.fail("get", "nodes", 403)
    evidence = cluster.collect(NS, pod["metadata"]["name"])
    assert evidence.node is None
    assert any("may not get nodes" in e["message"] for e in evidence.events if e["reason"] == "VllmOncallNote")


def test_503_twice_then_success_is_retried_logged_and_counted(kube_api, cluster, sleeps, caplog):
    _, pod = crashing_deployment(kube_api)
    kube_api.fail("get", "pods", 503, times=2)
    seen = []
    cluster.api.retry.count = lambda event: seen.append((event.api, event.call, event.reason))

    with caplog.at_level("WARNING", logger="bot.retry"):
        evidence = cluster.collect(NS, pod["metadata"]["name"])

    assert evidence.pod is not None
    assert seen == [("kubernetes", "get pods", "http_503"), ("kubernetes", "get pods", "http_503")]
    assert len(sleeps) == 2
    assert sum("retry 1/4" in r.getMessage() or "retry 2/4" in r.getMessage() for r in caplog.records) == 2
    assert [c.verb for c in kube_api.calls if c.resource == "pods"][:3] == ["get", "get", "get"]


def test_429_honours_retry_after(kube_api, cluster, sleeps):
    _, pod = crashing_deployment(kube_api)
    kube_api.fail("list", "events", 429, times=1, retry_after="3")
    cluster.collect(NS, pod["metadata"]["name"])
    assert sleeps == [3.0]


def test_retries_are_bounded(kube_api, cluster, sleeps):
    _, pod = crashing_deployment(kube_api)
    kube_api.fail("get", "pods", 500)
    with pytest.raises(KubeUnavailable) as info:
        cluster.collect(NS, pod["metadata"]["name"])
    assert info.value.status == 500 and str(info.value).startswith("Kubernetes API error 500: ")
    assert len(sleeps) == 4  # five attempts
    assert len([c for c in kube_api.calls if c.resource == "pods" and c.verb == "get"]) == 5


def test_connection_refused_is_retried_then_raised(sleeps):
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = "http://127.0.0.1:9"  # discard port: nothing listens
    cfg.retries = False
    api = KubeApi(client.ApiClient(cfg), retry=RetryPolicy(attempts=3, initial=0.001, sleep=sleeps))
    with pytest.raises(KubeUnavailable) as info:
        api.get_pod(NS, "x")
    assert len(sleeps) == 2
    assert str(info.value).startswith("Kubernetes API at http://127.0.0.1:9 unreachable (get pods): ") and "\n" not in str(info.value)


def test_collected_evidence_diagnoses_end_to_end(kube_api, cluster):
    from pathlib import Path

    from bot.diagnosis.diagnose import diagnose

    log = Path(__file__).resolve().parents[2] / "examples" / "incident" / "bundle" / "previous.log"
    _, pod = crashing_deployment(kube_api, containers=[container(
        command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
        args=["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"])], previous_log=log.read_text())
    result = diagnose(cluster.collect(NS, pod["metadata"]["name"]))
    assert result.cause is not None and result.changes


def test_an_alerts_collect_does_not_list_the_gpu_pods_on_the_node(kube_api, cluster):
    _, pod = crashing_deployment(kube_api)
    evidence = cluster.collect(NS, pod["metadata"]["name"])
    assert evidence.node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A10G"
    assert GPU_PODS_ANNOTATION not in (evidence.node["metadata"].get("annotations") or {})
    assert not [c for c in kube_api.calls if c.verb == "list" and c.resource == "pods"]


def _with_images(node: dict, count: int = 50) -> dict:
    """The node as a GPU node's kubelet reports it: every image pulled on it (at most 50), 10-20 KB."""
    node["status"]["images"] = [{"names": [f"nvcr.io/nvidia/image-{i}@sha256:{i:064x}", f"nvcr.io/nvidia/image-{i}:v{i}"],
                                 "sizeBytes": 1_000_000_000 + i} for i in range(count)]
    return node


def test_an_alerts_evidence_leaves_out_the_images_on_the_node_and_diagnoses_the_same(kube_api, cluster):
    from pathlib import Path

    from bot.diagnosis.diagnose import diagnose

    log = (Path(__file__).resolve().parents[2] / "examples" / "incident" / "bundle" / "previous.log").read_text()
    _, pod = crashing_deployment(kube_api, containers=[container(
        command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
        args=["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"])], previous_log=log)
    name = pod["metadata"]["name"]
    without = cluster.collect(NS, name)
    kube_api.edit("Node", "gpu-node-1", "", _with_images)
    served = kube_api.get("Node", "gpu-node-1")

    evidence = cluster.collect(NS, name)
    assert "images" not in evidence.node["status"]
    kept = {k: v for k, v in served["status"].items() if k != "images"}
    assert evidence.node == {**served, "status": kept}  # all else as the server sent it
    assert diagnose(evidence).model_dump() == diagnose(without).model_dump()
    ticket = cluster.collect(NS, name, gpu_pods=True)  # `vllm-oncall collect`: as kubectl prints the node
    assert ticket.node["status"]["images"] == served["status"]["images"]


def test_an_ordinary_error_exit_reads_no_events(kube_api, cluster):
    # exit 1, reason Error: the application raised and its log says why; the events (here a
    # liveness kill's, to prove they are not read) cannot change the diagnosis.
    _, pod = crashing_deployment(kube_api, previous_log="ValueError: boom\n", exit_code=1)
    evidence = cluster.collect(NS, pod["metadata"]["name"])
    assert evidence.events == []
    assert not [c for c in kube_api.calls if c.resource == "events"]


def test_a_probe_kill_reads_the_events_and_is_diagnosed_through_the_live_path(kube_api, cluster):
    from pathlib import Path

    import yaml

    from bot.diagnosis.diagnose import diagnose

    bundle = Path(__file__).resolve().parents[1] / "fixtures" / "bundles" / "probe-v1-0.11-liveness"
    pod = yaml.safe_load((bundle / "pod.yaml").read_text())
    assert pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 137
    kube_api.put(yaml.safe_load((bundle / "node.yaml").read_text()))
    kube_api.put(pod)
    for event in yaml.safe_load((bundle / "events.yaml").read_text())["items"]:
        kube_api.put(event)
    name = pod["metadata"]["name"]
    kube_api.set_log(NS, name, "vllm", (bundle / "previous.log").read_text())

    result = diagnose(cluster.collect(NS, name))

    assert [c.query.get("fieldSelector") for c in kube_api.calls if c.resource == "events"] == [
        f"involvedObject.name={name}"]
    assert result.cause == json.loads((bundle / "expected.json").read_text())["cause"] == "probe-killed-during-load"
    assert any("Liveness probe failed" in line for line in result.evidence), result.evidence


def last_exit(**terminated):
    return {"status": {"containerStatuses": [{"name": "vllm", "lastState": {"terminated": terminated}}]}}


@pytest.mark.parametrize("pod, read", [
    (last_exit(exitCode=1, reason="Error"), False),  # the application raised
    (last_exit(exitCode=2, reason="Error"), False),
    (last_exit(exitCode=137, reason="Error"), True),  # SIGKILL: a probe's kill, the OOM killer
    (last_exit(exitCode=143, reason="Error"), True),  # SIGTERM
    (last_exit(exitCode=0, reason="Completed"), True),  # vLLM stopping cleanly on a probe's SIGTERM
    (last_exit(exitCode=0, reason="Error"), True),
    (last_exit(exitCode=1, reason="OOMKilled"), True),
    (last_exit(exitCode=128, reason="ContainerCannotRun"), True),
    (last_exit(exitCode=1, reason="Error", signal=9), True),
    (last_exit(reason="Error"), True),  # no exit code to go on
    (last_exit(exitCode=1), True),  # no reason
    ({"status": {"containerStatuses": [{"name": "vllm", "lastState": {}}]}}, True),  # never terminated
    ({"status": {"containerStatuses": [{"name": "sidecar", "lastState": {"terminated": {
        "exitCode": 1, "reason": "Error"}}}]}}, True),  # only another container's status
    ({}, True),
])
def test_events_are_read_unless_the_last_exit_was_an_ordinary_error(pod, read):
    assert events_can_explain(pod, "vllm") is read



def test_a_long_retry_after_is_capped_by_the_bots_policy_not_slept_by_urllib3(kube_api, sleeps, caplog,
                                                                              tmp_path):
    import threading

    from bot.kube.api import api_client_from_environment

    _, pod = crashing_deployment(kube_api)
    kube_api.fail("get", "pods", 429, times=1, retry_after="3600")
    api = KubeApi(api_client_from_environment(kubeconfig=kubeconfig_for(kube_api.url, tmp_path / "kubeconfig")),
                  retry=RetryPolicy(max_retry_after=60.0, sleep=sleeps,
                                    count=lambda event: seen.append((event.call, event.reason))))
    seen: list[tuple[str, str]] = []
    got: list[dict] = []

    # In a thread, so that a client which sleeps the hour itself fails this test in seconds.
    with caplog.at_level("WARNING", logger="bot.retry"):
        worker = threading.Thread(target=lambda: got.append(api.get_pod(NS, pod["metadata"]["name"])),
                                  daemon=True)
        worker.start()
        worker.join(timeout=20)

    assert not worker.is_alive(), "the client slept the server's Retry-After itself"
    assert got and got[0]["metadata"]["name"] == pod["metadata"]["name"]
    assert sleeps == [60.0]  # capped at max_retry_after, waited by the bot's policy
    assert seen == [("get pods", "http_429")]
    assert any("kubernetes get pods failed (http_429: " in r.getMessage() and "retry 1/4 in 60.00s" in r.getMessage()
               for r in caplog.records)
    assert [c.code for c in kube_api.calls if c.resource == "pods" and c.verb == "get"] == [429, 200]


def test_the_api_servers_proxy_is_taken_from_the_environment_once_not_at_every_request(monkeypatch, tmp_path):
    """The token-refresh hook re-assigns the host before every request; the proxy for that host
    is resolved when the client is made and stays (no walk over the environment per call)."""
    from bot.kube.api import api_client_from_environment

    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.delenv("https_proxy", raising=False)
    cfg = api_client_from_environment(
        kubeconfig=kubeconfig_for("https://k8s.example:6443", tmp_path / "kubeconfig")).configuration
    assert cfg.proxy == "http://proxy.example:3128"

    monkeypatch.setenv("HTTPS_PROXY", "http://another.example:3128")
    assert cfg.get_api_key_with_prefix("BearerToken") == "Bearer not-a-secret"  # the hook every request runs
    assert cfg.host == "https://k8s.example:6443" and cfg.proxy == "http://proxy.example:3128"
