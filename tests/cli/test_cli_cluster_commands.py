"""Terminal commands why / collect / apply / rollback against the API stand-in (through a kubeconfig,
as a person would run them), and `fix` rewriting a manifest file in place."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml
from kubeapi.objects import container, crashing_deployment

from bot.cli import main
from bot.diagnosis.evidence import load_bundle

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "incident" / "bundle"
NS = "inference"


@pytest.fixture
def crash_log() -> str:
    return (EXAMPLE / "previous.log").read_text()


@pytest.fixture
def kubeconfig(kube_api, tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
        "clusters": [{"name": "stand-in", "cluster": {"server": kube_api.url}}],
        "users": [{"name": "bot", "user": {"token": "not-a-secret"}}],
        "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "bot"}}],
    }))
    return str(path)


@pytest.fixture
def crashing(kube_api, crash_log):
    return crashing_deployment(kube_api, containers=[container(
        command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
        args=["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"])], previous_log=crash_log)


def test_why_prints_the_diagnose_report_and_the_workload(kubeconfig, crashing, capsys):
    assert main(["why", "llama", "-n", NS, "--kubeconfig", kubeconfig]) == 0
    out = capsys.readouterr().out
    assert "Cause:" in out and "Workload: Deployment inference/llama (container vllm)" in out
    assert f"vllm-oncall apply {NS}/" in out


def test_why_json_matches_diagnose_json_on_the_collected_bundle(kubeconfig, crashing, tmp_path, capsys):
    assert main(["why", f"{NS}/llama", "--format", "json", "--kubeconfig", kubeconfig]) == 0
    live = json.loads(capsys.readouterr().out)
    assert main(["collect", f"{NS}/llama", "-o", str(tmp_path / "bundle"), "--kubeconfig", kubeconfig]) == 0
    written = capsys.readouterr().out.split()
    assert {Path(p).name for p in written} == {"previous.log", "pod.yaml", "node.yaml", "events.yaml",
                                               "deployment.yaml"}
    assert load_bundle(tmp_path / "bundle").pod["metadata"]["namespace"] == NS
    assert main(["diagnose", str(tmp_path / "bundle"), "--format", "json"]) == 0
    offline = json.loads(capsys.readouterr().out)
    assert live["cause"] == offline["cause"] and live["changes"] == offline["changes"]


def test_apply_then_rollback_from_the_terminal(kube_api, kubeconfig, crashing, capsys):
    before = kube_api.get("Deployment", "llama", NS)["spec"]["template"]["spec"]["containers"][0]
    assert main(["apply", "llama", "-n", NS, "--yes", "--as", "alice", "--kubeconfig", kubeconfig]) == 0
    out = capsys.readouterr().out
    assert "dry run: server-side dry run passed" in out and "patched Deployment inference/llama" in out
    after = kube_api.get("Deployment", "llama", NS)
    assert after["spec"]["template"]["spec"]["containers"][0]["args"] != before["args"]
    assert json.loads(after["metadata"]["annotations"]["vllm-oncall.io/last-change"])[-1]["who"] == "alice"

    assert main(["rollback", "deployment/llama", "-n", NS, "--as", "bob", "--kubeconfig", kubeconfig]) == 0
    assert "rolled back Deployment inference/llama" in capsys.readouterr().out
    assert kube_api.get("Deployment", "llama", NS)["spec"]["template"]["spec"]["containers"][0] == before


def test_unknown_pod_and_missing_permission_are_one_line_errors(kube_api, kubeconfig, crashing, capsys):
    assert main(["why", "lama-xyz", "-n", NS, "--kubeconfig", kubeconfig]) == 2
    assert "not found" in capsys.readouterr().err
    kube_api.fail("get", "pods", 403)
    assert main(["why", "llama", "-n", NS, "--kubeconfig", kubeconfig]) == 2
    assert "may not get pods in namespace inference" in capsys.readouterr().err


MANIFEST = textwrap.dedent("""\
    # Production Llama. Reviewed by ml-platform; keep the comments.
    apiVersion: apps/v1
    kind: Deployment
    metadata:
      name: vllm-llama3-8b
      namespace: inference
    spec:
      replicas: 1
      selector:
        matchLabels:
          app.kubernetes.io/name: vllm-llama3-8b
      template:
        metadata:
          labels:
            app.kubernetes.io/name: vllm-llama3-8b
        spec:
          containers:
            - name: vllm
              image: vllm/vllm-openai:v0.10.2
              command: ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
              args:
                - --host
                - 0.0.0.0
                - --port
                - "8000"
                - --max-model-len   # context we promised the product team
                - "32768"
                - --gpu-memory-utilization
                - "0.9"
    ---
    apiVersion: v1
    kind: Service
    metadata:
      name: vllm-llama3-8b  # the router points here
    spec:
      ports: [{port: 8000}]
    """)


def test_fix_rewrites_the_manifest_in_place_keeping_comments_and_layout(tmp_path, capsys, crash_log):
    from bot.diagnosis.diagnose import diagnose

    expected_change = next(c for c in diagnose(load_bundle(EXAMPLE)).changes if c.kind == "flag")
    manifest = tmp_path / "llama.yaml"
    manifest.write_text(MANIFEST)

    assert main(["fix", str(EXAMPLE), "--manifest", str(manifest)]) == 0

    assert "changed args" in capsys.readouterr().out
    new_text = manifest.read_text()
    old_value = f'"{expected_change.before}"'
    assert new_text == MANIFEST.replace(old_value, f'"{expected_change.after}"', 1)
    assert main(["fix", str(EXAMPLE), "--manifest", str(manifest)]) == 0  # second run: nothing to do
    assert "already as proposed" in capsys.readouterr().out


def test_why_on_a_gitops_workload_prints_the_repository_change(kube_api, kubeconfig, crash_log, capsys):
    crashing_deployment(kube_api, annotations={"argocd.argoproj.io/tracking-id": "llm:apps/Deployment:inference/llama"},
                        containers=[container(command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
                                              args=["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"])],
                        previous_log=crash_log)
    assert main(["why", "llama", "-n", NS, "--kubeconfig", kubeconfig]) == 0
    out = capsys.readouterr().out
    assert "No live patch: managed by Argo CD application llm" in out
    assert "In the repository's manifest for Deployment inference/llama" in out and "(proposed)" in out
    assert not [c for c in kube_api.calls if c.verb == "patch"], "why never writes, not even a dry run"
