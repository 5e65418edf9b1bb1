"""`vllm-oncall plan`: the memory model on a manifest, before any crash (issue 12).

The main check: on the Deployment of a fixture crash bundle (its pod's template) and its node,
plan predicts the crash `diagnose` names from that bundle's log. The bundles listed are those
whose crash is a budget stage (weights, topology, KV sizing); a crash the budget cannot see
(a probe, a tenant, a software problem) is not something plan can predict from a manifest.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from builders import FIXTURE_BUNDLES

from bot.cli import main
from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evidence import load_bundle

PREDICTABLE = [
    "kv-pinned-pool-0.19", "kv-v0-0.6-api-server", "tp-70b-tp4-node1", "kv-v1-0.10-estimate", "mig-mixed-3g40gb-kv",
    "mig-single-1g10gb-8b", "mrv2-weights-0.33-l40s-24b", "nokv-v1-0.11-tp2", "tp-70b-limit1-node8",
    "tp-ray-placement-group", "tp-v1-0.13-world-size", "tp2-limit1-no-shm", "weights-70b-tp1-node8-shm",
    "weights-fp8-l40s-32b-1gpu", "weights-newest-wrapper", "weights-v0-0.4-fp32-torch21",
    "weights-v0-0.5-make-layers", "weights-v100-no-fp8-1gpu",
]


def deployment_of(bundle, tmp_path):
    """The Deployment that made the bundle's pod: its spec as the pod template."""
    pod = yaml.safe_load((bundle / "pod.yaml").read_text())
    name = pod["metadata"]["ownerReferences"][0]["name"].rsplit("-", 1)[0] if pod["metadata"].get("ownerReferences") \
        else pod["metadata"]["name"]
    doc = {"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": name, "namespace": pod["metadata"].get("namespace", "default")},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}}, "spec": pod["spec"]}}}
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def plan_json(capsys, *args):
    code = main(["plan", *args, "--format", "json"])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if captured.out else None), captured.err


@pytest.mark.parametrize("name", PREDICTABLE)
def test_plan_predicts_the_crash_the_bundle_shows(name, tmp_path, capsys):
    bundle = FIXTURE_BUNDLES / name
    code, doc, err = plan_json(capsys, str(deployment_of(bundle, tmp_path)), "--node", str(bundle / "node.yaml"))
    assert code == 1, err
    assert doc["fits"] is False
    assert doc["predicted_crash"] == diagnose(load_bundle(bundle)).cause


def test_plan_proposes_the_lever_diagnose_proposes_after_the_crash(tmp_path, capsys):
    bundle = FIXTURE_BUNDLES / "tp-70b-limit1-node8"
    code, doc, _ = plan_json(capsys, str(deployment_of(bundle, tmp_path)), "--node", str(bundle / "node.yaml"))
    assert code == 1 and doc["change"] == "limits.nvidia.com/gpu 4" and doc["change_margin_gib"] >= 0.5


def test_plan_of_a_fitting_manifest_exits_0(tmp_path, capsys):
    bundle = FIXTURE_BUNDLES / "kv-v1-0.10-estimate"  # Llama-3.1-8B at 131072: too long for an L4, fine on an H100
    code, doc, err = plan_json(capsys, str(deployment_of(bundle, tmp_path)), "--gpu", "NVIDIA-H100-80GB-HBM3")
    assert code == 0, err
    assert doc["fits"] is True and doc["margin_gib"] > 0.5 and doc["predicted_crash"] is None


def test_plan_with_a_gpu_product_names_the_shorter_context(tmp_path, capsys):
    bundle = FIXTURE_BUNDLES / "kv-v1-0.10-estimate"
    code, doc, _ = plan_json(capsys, str(deployment_of(bundle, tmp_path)), "--gpu", "NVIDIA-L4")
    assert code == 1 and doc["first_failure"] == "kv_sizing"
    assert doc["change"].startswith("--max-model-len ") and int(doc["change"].split()[1]) < 131072


def test_plan_text_output(tmp_path, capsys):
    bundle = FIXTURE_BUNDLES / "weights-v100-no-fp8-1gpu"
    code = main(["plan", str(deployment_of(bundle, tmp_path)), "--node", str(bundle / "node.yaml")])
    out = capsys.readouterr().out
    assert code == 1
    assert "Does not fit: fails at weights" in out and "It would crash as: weights-exceed-gpu" in out
    assert "Advice (not a change to approve)" in out


@pytest.mark.parametrize(("args", "message"), [
    (["missing.yaml", "--gpu", "L4"], "missing.yaml: No such file or directory"),
    (["DEPLOY"], "give the node the pod will run on"),
    (["DEPLOY", "--gpu", "NVIDIA-FOO-9000"], "its memory is not known here"),
    (["NOTYAML", "--gpu", "L4"], "not valid YAML"),
    (["NODE", "--gpu", "L4"], "no Deployment, StatefulSet or Pod in it"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path):
    deploy = deployment_of(FIXTURE_BUNDLES / "kv-v1-0.10-estimate", tmp_path)
    (tmp_path / "bad.yaml").write_text("a: [1, 2\n")
    files = {"DEPLOY": str(deploy), "NOTYAML": str(tmp_path / "bad.yaml"),
             "NODE": str(FIXTURE_BUNDLES / "kv-v1-0.10-estimate" / "node.yaml")}
    proc = subprocess.run([sys.executable, "-m", "bot.cli", "plan", *[files.get(a, a) for a in args]],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr


# ---- plan --vllm-version: the flags a target release lacks or renamed (issue 22) -------------


def flag_manifest(tmp_path, args):
    doc = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "qwen", "namespace": "inference"},
           "spec": {"template": {"spec": {"containers": [
               {"name": "vllm", "image": "vllm/vllm-openai:v0.16.0", "args": ["Qwen/Qwen2.5-7B-Instruct", *args]}]}}}}
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_plan_vllm_version_names_a_removed_flag_and_exits_1(tmp_path, capsys):
    manifest = flag_manifest(tmp_path, ["--disable-log-requests", "--max-model-len", "8192"])
    code, doc, _ = plan_json(capsys, manifest, "--vllm-version", "0.32")
    assert code == 1
    assert [(r["flag"], r["state"], r["removed_in"]) for r in doc["flags"]["refused"]] == \
        [("--disable-log-requests", "removed", "0.17.1")]
    assert "predicted_crash" not in doc  # no node given: only the command line is checked


def test_plan_vllm_version_0_33_with_disable_log_requests(tmp_path, capsys):
    """0.33's EnableDisableAction accepts --disable-log-requests again as the off switch of
    --enable-log-requests: plan says so (and that the flag itself went in 0.17), and still names
    the flags 0.33 lacks (exit 1)."""
    manifest = flag_manifest(tmp_path, ["--disable-log-requests", "--swap-space", "4"])
    code = main(["plan", manifest, "--vllm-version", "0.33"])
    out = capsys.readouterr().out
    assert code == 1
    assert "--disable-log-requests: accepted only as the off/on twin of --enable-log-requests" in out
    assert "removed in vLLM 0.17.1" in out
    assert "--swap-space: --swap-space is gone from vLLM 0.18.1" in out and "-> remove it" in out
    assert main(["plan", flag_manifest(tmp_path, ["--disable-log-requests"]), "--vllm-version", "0.33"]) == 0


def test_plan_vllm_version_names_the_new_spelling(tmp_path, capsys):
    code, doc, _ = plan_json(capsys, flag_manifest(tmp_path, ["--cuda-graph-sizes", "8"]), "--vllm-version", "0.13.0")
    assert code == 1 and doc["flags"]["refused"][0]["use_instead"] == "--cudagraph-capture-sizes"


def test_plan_vllm_version_with_every_flag_accepted_exits_0(tmp_path, capsys):
    manifest = flag_manifest(tmp_path, ["--max-model-len", "8192", "-tp", "1", "--device-memory-utilization", "0.9"])
    code, doc, _ = plan_json(capsys, manifest, "--vllm-version", "0.33.0")
    assert code == 0 and doc["flags"]["accepts_every_flag"] is True
    # the alias is newer than 0.30: named, with the spelling 0.30 has
    code, doc, _ = plan_json(capsys, manifest, "--vllm-version", "0.30.0")
    assert code == 1 and doc["flags"]["refused"][0]["use_instead"] == "--gpu-memory-utilization"


def test_plan_vllm_version_with_a_node_checks_both(tmp_path, capsys):
    bundle = FIXTURE_BUNDLES / "kv-v1-0.10-estimate"
    code, doc, _ = plan_json(capsys, str(deployment_of(bundle, tmp_path)), "--node", str(bundle / "node.yaml"),
                             "--vllm-version", "0.10.1")
    assert code == 1 and doc["fits"] is False and doc["flags"]["accepts_every_flag"] is True


@pytest.mark.parametrize(("version", "message"), [
    ("abc", "is not a vLLM version"), ("0.40", "the flag table holds vLLM 0.6.0 to 0.33.0"),
    ("0.5.4", "the flag table holds vLLM 0.6.0 to 0.33.0")])
def test_plan_vllm_version_bad_input_is_one_line_and_exit_2(version, message, tmp_path, capsys):
    code = main(["plan", flag_manifest(tmp_path, ["--max-model-len", "8192"]), "--vllm-version", version])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1 and message in captured.err
