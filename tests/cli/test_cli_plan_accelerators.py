"""`vllm-oncall plan` on manifests as users write them (issue 21): no metadata.namespace, GKE
nodes that carry only GKE's accelerator labels, and "cannot judge" as its own exit code."""

from __future__ import annotations

import json

import yaml

from bot.cli import main


def manifest(tmp_path, model="meta-llama/Llama-3.1-8B-Instruct", args=("--max-model-len", "4096"), with_ns=False):
    meta = {"name": "llm", **({"namespace": "team"} if with_ns else {})}
    doc = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
           "spec": {"template": {"spec": {"containers": [{
               "name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "args": ["--model", model, *args],
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
