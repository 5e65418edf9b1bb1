"""Bad input on the command line: one line on stderr, never a traceback, the right exit code.

Each case runs `python -m bot.cli` as a separate process, as a person or a script would, so an
exception that escapes main() would show up here as a traceback.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from builders import kubeconfig_for
from kubeapi.objects import container, crashing_deployment

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "examples" / "incident" / "bundle"
NS = "inference"


def run(*argv: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bot.cli", *argv], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, cwd=cwd or ROOT,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", **(env or {})})


def one_line(result: subprocess.CompletedProcess, code: int = 2) -> str:
    """The single stderr line, after checking there is exactly one and no traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert result.returncode == code, (result.returncode, result.stderr)
    assert lines[0].startswith("vllm-oncall"), lines[0]
    return lines[0]



def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def crashing(kube_api, tmp_path):
    crashing_deployment(kube_api, containers=[container(
        command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
        args=["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"])],
        previous_log=(BUNDLE / "previous.log").read_text())
    return kubeconfig_for(kube_api.url, tmp_path / "kubeconfig")


# ---- the cluster commands ------------------------------------------------------------------


def test_apply_without_a_terminal_refuses_to_prompt(crashing, kube_api):
    before = kube_api.get("Deployment", "llama", NS)
    line = one_line(run("apply", "llama", "-n", NS, "--kubeconfig", crashing))
    assert "stdin is not a terminal" in line and "--yes" in line
    assert kube_api.get("Deployment", "llama", NS) == before  # nothing was patched


def test_why_with_a_kubeconfig_that_is_not_yaml(tmp_path):
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nclusters: [\n  - name: x\n  server: {{ oops\n")
    line = one_line(run("why", "llama", "--kubeconfig", str(bad)))
    assert str(bad) in line and "not valid YAML" in line


def test_why_with_a_kubeconfig_that_is_missing(tmp_path):
    line = one_line(run("why", "llama", "--kubeconfig", str(tmp_path / "nope")))
    assert "nope" in line


def test_why_with_an_unreachable_server_answers_fast(tmp_path):
    """The old path spent 10 s in retries before saying so. Timed against the same command failing
    before any network call (a missing kubeconfig), so the process start-up, which a busy machine
    stretches far more than the retries' sleeps, is taken out of the figure."""
    port = closed_port()
    started = time.monotonic()
    one_line(run("why", "llama", "--kubeconfig", str(tmp_path / "missing")))
    start_up = time.monotonic() - started
    started = time.monotonic()
    line = one_line(run("why", "llama", "--kubeconfig", kubeconfig_for(f"https://127.0.0.1:{port}", tmp_path / "k")))
    assert f"cannot reach the Kubernetes API server at https://127.0.0.1:{port}" in line
    assert time.monotonic() - started - start_up < 6, "retries on a refused connection must not take seconds"


def test_why_without_permission_names_the_verb(crashing, kube_api):
    kube_api.fail("get", "pods", 403)
    line = one_line(run("why", "llama", "-n", NS, "--kubeconfig", crashing))
    assert "may not get pods in namespace inference" in line


def test_serve_with_no_kubeconfig_and_not_in_a_cluster(tmp_path):
    env = {"VLLM_ONCALL_CLUSTER": "c", "SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1",
           "VLLM_ONCALL_SLACK_CHANNEL": "C0ALERTS", "VLLM_ONCALL_MODE": "proposals-only",
           "VLLM_ONCALL_ALERT_TOKEN": "t", "VLLM_ONCALL_LISTEN": "127.0.0.1:0", "KUBECONFIG": str(tmp_path / "none")}
    line = one_line(run("serve", env=env))
    assert "no Kubernetes access: not running in a pod" in line


def test_serve_config_file_with_an_unknown_key(tmp_path):
    config = tmp_path / "oncall.yaml"
    config.write_text("vllm_oncall_clustr: prod\n")
    env = {"VLLM_ONCALL_CLUSTER": "c", "SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1",
           "VLLM_ONCALL_SLACK_CHANNEL": "C0ALERTS", "VLLM_ONCALL_MODE": "proposals-only"}
    line = one_line(run("serve", "--check", "--offline", "--config", str(config), env=env))
    assert "unknown setting 'vllm_oncall_clustr'" in line and "vllm_oncall_cluster" in line


# ---- fix: the manifest file ----------------------------------------------------------------


def test_fix_with_a_missing_manifest(tmp_path):
    line = one_line(run("fix", str(BUNDLE), "--manifest", str(tmp_path / "deploy.yaml")))
    assert f"{tmp_path / 'deploy.yaml'}: No such file or directory" in line


@pytest.mark.parametrize("text, words", [
    ("apiVersion: apps/v1\nkind: Deployment\nspec: [unclosed\n", "not valid YAML at line"),
    ("apiVersion: v1\nkind: Service\nmetadata: {name: llama}\nspec: {ports: [{port: 80}]}\n",
     "no Deployment or StatefulSet to rewrite (it holds Service)"),
    ("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {{ .Release.Name }}\n"
     "spec:\n  replicas: {{ .Values.replicas }}\n", "a Helm/Go template"),
], ids=["invalid-yaml", "service-only", "helm-template"])
def test_fix_on_a_manifest_it_cannot_rewrite(tmp_path, text, words):
    manifest = tmp_path / "deploy.yaml"
    manifest.write_text(text)
    line = one_line(run("fix", str(BUNDLE), "--manifest", str(manifest)))
    assert words in line and str(manifest) in line
    assert manifest.read_text() == text


def test_fix_with_a_container_that_is_not_there(tmp_path):
    manifest = tmp_path / "deploy.yaml"
    shutil.copy(BUNDLE / "deployment.yaml", manifest)
    line = one_line(run("fix", str(BUNDLE), "--manifest", str(manifest), "-c", "nosuch"))
    assert "nosuch" in line
    assert manifest.read_text() == (BUNDLE / "deployment.yaml").read_text()


def test_fix_warns_when_the_manifest_is_not_what_the_pod_ran(tmp_path):
    manifest = tmp_path / "deploy.yaml"
    manifest.write_text((BUNDLE / "deployment.yaml").read_text().replace("- '32768'", "- '16384'")
                        .replace("- \"32768\"", "- \"16384\"").replace("- 32768", "- 16384"))
    assert "16384" in manifest.read_text()
    result = run("fix", str(BUNDLE), "--manifest", str(manifest))
    line = one_line(result, code=0)
    assert "warning" in line and "--max-model-len is '16384' in the manifest but '32768' in the crashed pod" in line
    assert "the proposal sets it to '18432'" in line
    assert "changed args" in result.stdout and "- \"18432\"" in manifest.read_text()


# ---- the offline commands ------------------------------------------------------------------


@pytest.mark.parametrize("argv, words", [
    (["diagnose", "no-such-folder"], "no-such-folder"),
    (["diagnose", "--log", "no-such.log"], "no-such.log"),
    (["eval", "no-such-corpus"], "no-such-corpus"),
    (["diagnose", str(BUNDLE), "--playbooks", "no-such-playbooks"], "no-such-playbooks: no playbooks folder"),
])
def test_unreadable_input_files(argv, words):
    assert words in one_line(run(*argv))
