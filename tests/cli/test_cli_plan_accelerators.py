"""`vllm-oncall plan` on manifests as users write them (issue 21): no metadata.namespace, GKE
nodes that carry only GKE's accelerator labels, and "cannot judge" as its own exit code."""

from __future__ import annotations

import json

import yaml

from bot.cli import main


def manifest(tmp_path, model="meta-llama/Llama-3.1-8B-Instruct", args=("--max-model-len", "4096"), with_ns=False,
             image="vllm/vllm-openai:v0.11.0"):
    meta = {"name": "llm", **({"namespace": "team"} if with_ns else {})}
    doc = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
           "spec": {"template": {"spec": {"containers": [{
               "name": "vllm", "image": image, "args": ["--model", model, *args],
               "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def gke_node(tmp_path, accelerator="nvidia-l4"):
    doc = {"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": "gke-pool-1", "labels": {"cloud.google.com/gke-accelerator": accelerator,
                                                          "cloud.google.com/gke-accelerator-count": "1"}},
           "status": {"allocatable": {"nvidia.com/gpu": "1", "memory": "60Gi"}}}
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def run(capsys, *args):
    code = main(["plan", *args, "--format", "json"])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if out.out else None), out.err


def test_a_manifest_without_namespace_is_planned_in_default(tmp_path, capsys):
    code, doc, err = run(capsys, manifest(tmp_path), "--gpu", "NVIDIA-L4")
    assert code in (0, 1), err
    assert "Traceback" not in err and "unexpected" not in err
    assert doc["workload"] == "default/llm"


def test_a_gke_node_gets_its_memory_from_gke_accelerator(tmp_path, capsys):
    code, doc, err = run(capsys, manifest(tmp_path), "--node", gke_node(tmp_path))
    assert code == 0, err
    assert doc["verdict"] == "fits"
    assert "nvidia-l4" in doc["gpus"] and "GiB" in doc["gpus"]
    assert "no GPU memory" not in json.dumps(doc)


def test_cannot_judge_has_its_own_exit_code(tmp_path, capsys):
    # a node with a GPU nothing knows the memory of, and a model of unknown size
    code, doc, err = run(capsys, manifest(tmp_path, model="my-org/in-house", args=()),
                         "--node", gke_node(tmp_path, accelerator="nvidia-unknown-x"))
    assert doc["verdict"] == "unknown", doc
    assert code == 3, err


def test_plan_searches_a_shorter_context_with_a_lower_utilization(tmp_path, capsys):
    """8B on one A10G at 0.95 / 32768 on V0 (0.7.3: its profiling run takes max_model_len tokens): no
    single lever leaves a margin (0.95 starves start-up), a shorter context together with a lower
    utilization does, and plan checks that pair fits. On 0.11.0 (V1 only, a 2048-token profiling
    batch on this card) the same manifest fits as it is."""
    v1 = manifest(tmp_path, args=("--gpu-memory-utilization", "0.95", "--max-model-len", "32768"))
    code, doc, err = run(capsys, v1, "--gpu", "NVIDIA-A10G")
    assert code == 0 and doc["verdict"] == "fits", (err, doc)
    v0 = "vllm/vllm-openai:v0.7.3"
    path = manifest(tmp_path, args=("--gpu-memory-utilization", "0.95", "--max-model-len", "32768"), image=v0)
    code, doc, err = run(capsys, path, "--gpu", "NVIDIA-A10G")
    assert code == 1, err
    assert doc["verdict"] == "fails" and doc["change"], doc
    assert "--max-model-len" in doc["change"] and "--gpu-memory-utilization" in doc["change"]
    assert doc["change_margin_gib"] >= 0.5
    length = int(doc["change"].split("--max-model-len ")[1].split()[0])
    util = doc["change"].split("--gpu-memory-utilization ")[1].split()[0]
    # the proposed pair, written into the manifest, plans as fitting
    fixed = manifest(tmp_path, args=("--gpu-memory-utilization", util, "--max-model-len", str(length)), image=v0)
    code, doc, err = run(capsys, fixed, "--gpu", "NVIDIA-A10G")
    assert code == 0 and doc["verdict"] == "fits", (err, doc)


def test_the_issues_pair_fits_with_room(tmp_path, capsys):
    path = manifest(tmp_path, args=("--gpu-memory-utilization", "0.85", "--max-model-len", "4096"))
    code, doc, err = run(capsys, path, "--gpu", "NVIDIA-A10G")
    assert code == 0 and doc["margin_gib"] > 2.0, (err, doc)
