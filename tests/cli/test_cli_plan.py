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
