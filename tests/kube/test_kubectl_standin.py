"""The API stand-in held to a client nobody here wrote: the real `kubectl`.

Each command runs against the stand-in (discovery included: tests/kubeapi/discovery.py), and what
kubectl sees must equal what the bot's own client (bot/kube/api.py `KubeApi`) sees for the same
object. If kubectl cannot read the stand-in, the stand-in's wire format is not the API's."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from builders import require
from kubeapi.objects import crashing_deployment

from bot.kube.api import KubeApi

NS = "inference"
PREVIOUS_LOG = "INFO 11-30 05:00:00 starting\ntorch.OutOfMemoryError: CUDA out of memory.\n"




@pytest.fixture
def kubectl(kube_api, tmp_path: Path):
    """argv prefix for kubectl pointed at the stand-in, with its own discovery cache."""
    exe = require("kubectl")
    config = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    return [exe, "--kubeconfig", str(config), "--cache-dir", str(tmp_path / "cache"), "--request-timeout", "5s"]


def run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_get_pods_json_sees_the_pod_the_bot_reads(kube_api, kubectl):
    _, pod = crashing_deployment(kube_api, previous_log=PREVIOUS_LOG)
    name = pod["metadata"]["name"]
    listed = json.loads(run(kubectl + ["get", "pods", "-n", NS, "-o", "json"]))
    bot = KubeApi(kube_api.api_client()).get_pod(NS, name)
    assert [p["metadata"]["name"] for p in listed["items"]] == [name]
    seen = listed["items"][0]
    assert seen["metadata"]["uid"] == bot["metadata"]["uid"] == pod["metadata"]["uid"]
    restarts = [s["restartCount"] for s in seen["status"]["containerStatuses"]]
    assert restarts == [s["restartCount"] for s in bot["status"]["containerStatuses"]] == [5]
    assert seen["metadata"]["resourceVersion"] == bot["metadata"]["resourceVersion"]
    # kubectl found the resource by discovery, the legacy way (the stand-in serves no aggregated form)
    assert {"/api", "/api/v1", "/apis", "/apis/apps/v1"} <= set(kube_api.discovery_calls)
    assert ("list", "", "pods") in kube_api.called()


def test_logs_previous_is_the_text_the_bot_reads(kube_api, kubectl):
    _, pod = crashing_deployment(kube_api, previous_log=PREVIOUS_LOG)
    name = pod["metadata"]["name"]
    kube_api.set_log(NS, name, "vllm", "INFO current run\n", previous=False)
    text = run(kubectl + ["logs", name, "-n", NS, "--previous"])
    bot = KubeApi(kube_api.api_client()).read_log(NS, name, "vllm", previous=True)
    assert text == bot == PREVIOUS_LOG
    assert run(kubectl + ["logs", name, "-n", NS]) == "INFO current run\n"
    tail = run(kubectl + ["logs", name, "-n", NS, "--previous", "--tail", "1"])
    assert tail == KubeApi(kube_api.api_client()).read_log(NS, name, "vllm", previous=True, tail_lines=1)
    assert tail == PREVIOUS_LOG.splitlines(keepends=True)[-1]


def test_watch_json_streams_the_changes_in_order(kube_api, kubectl):
    _, pod = crashing_deployment(kube_api, previous_log=PREVIOUS_LOG)
    name = pod["metadata"]["name"]
    proc = subprocess.Popen(kubectl + ["get", "pods", "-n", NS, "--watch", "-o", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    docs: list[dict] = []
    reader = threading.Thread(target=_read_json_docs, args=(proc, docs, 3), daemon=True)
    reader.start()
    try:
        assert kube_api.wait_for_watchers(1, timeout=10), "kubectl never opened a watch"
        kube_api.edit("Pod", name, NS, lambda o: o["status"]["containerStatuses"][0].update(restartCount=6))
        kube_api.edit("Pod", name, NS, lambda o: o["status"].update(phase="Failed"))
        reader.join(timeout=10)
    finally:
        proc.kill()
        proc.wait(timeout=5)
    assert len(docs) == 3, proc.stderr.read() if proc.stderr else ""
    assert [d["metadata"]["name"] for d in docs] == [name] * 3
    assert [d["status"]["containerStatuses"][0]["restartCount"] for d in docs] == [5, 6, 6]
    assert [d["status"]["phase"] for d in docs][-1] == "Failed"
    rvs = [int(d["metadata"]["resourceVersion"]) for d in docs]
    assert rvs == sorted(rvs) and len(set(rvs)) == 3
    bot = KubeApi(kube_api.api_client()).get_pod(NS, name)
    assert docs[-1]["metadata"]["resourceVersion"] == bot["metadata"]["resourceVersion"]
    assert ("watch", "", "pods") in kube_api.called()


def _read_json_docs(proc: subprocess.Popen, docs: list[dict], limit: int) -> None:
    """kubectl -o json --watch prints one indented JSON document per event; read `limit` of them."""
    decoder, buffer = json.JSONDecoder(), ""
    deadline = time.monotonic() + 15
    assert proc.stdout is not None
    while len(docs) < limit and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            return
        buffer += line
        try:
            doc, end = decoder.raw_decode(buffer.strip())
        except json.JSONDecodeError:
            continue
        docs.append(doc)
        buffer = buffer.strip()[end:]


def test_dry_run_patch_returns_the_patched_spec_and_changes_nothing(kube_api, kubectl):
    dep, _ = crashing_deployment(kube_api, previous_log=PREVIOUS_LOG)
    before = KubeApi(kube_api.api_client()).get_workload("Deployment", NS, "llama")
    ops = [{"op": "test", "path": "/spec/template/spec/containers/0/args", "value": ["--model", "m"]},
           {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--enforce-eager"}]
    out = json.loads(run(kubectl + ["patch", "deployment", "llama", "-n", NS, "--type=json",
                                    "-p", json.dumps(ops), "--dry-run=server", "-o", "json"]))
    bot = KubeApi(kube_api.api_client()).patch_workload("Deployment", NS, "llama", ops, dry_run=True)
    assert out["spec"]["template"]["spec"]["containers"][0]["args"] == ["--model", "m", "--enforce-eager"]
    assert out["spec"] == bot["spec"]
    after = KubeApi(kube_api.api_client()).get_workload("Deployment", NS, "llama")
    assert after == before and after["spec"] == dep["spec"]
    patches = [c for c in kube_api.calls if c.verb == "patch"]
    assert [c.dry_run for c in patches] == [True, True]
    stale = [{"op": "test", "path": "/spec/template/spec/containers/0/args", "value": ["--model", "other"]}]
    refused = subprocess.run(kubectl + ["patch", "deployment", "llama", "-n", NS, "--type=json",
                                        "-p", json.dumps(stale), "--dry-run=server"],
                             capture_output=True, text=True, timeout=20)
    assert refused.returncode != 0 and '"llama" is invalid' in refused.stderr
    assert KubeApi(kube_api.api_client()).get_workload("Deployment", NS, "llama") == before


def test_api_resources_names_every_kind_the_bot_uses(kube_api, kubectl):
    rows = run(kubectl + ["api-resources", "--no-headers", "-o", "wide"]).splitlines()
    names = {row.split()[0] for row in rows}
    assert {"pods", "events", "nodes", "deployments", "replicasets", "statefulsets", "vllmincidents"} <= names
    assert "deploy" in run(kubectl + ["api-resources", "--api-group", "apps"])
    # a short name resolves through discovery to the same object the bot reads
    dep, _ = crashing_deployment(kube_api, previous_log=PREVIOUS_LOG)
    seen = json.loads(run(kubectl + ["get", "deploy", "llama", "-n", NS, "-o", "json"]))
    assert seen["metadata"]["uid"] == dep["metadata"]["uid"]
