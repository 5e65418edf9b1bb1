"""`diagnose` after a crash and `plan` before one make one decision on the same pod and node
(issue 21: "fp8 plus a shorter context on one A100-80GB for a 70B model: diagnose says no, plan
says yes on the same hardware"; "TP 2 x PP 2 on 2 GPUs"). The lever and the shorter context come
from one search (levers.try_lever), so when the log's figures match the node's, both answers are
the same change with the same margin."""

from __future__ import annotations

import re

import pytest
from builders import make_node, make_pod, write_bundle
from test_accelerators import VENDORS, vendor_node, vendor_pod
from test_issue21_audit import LOADING, OWN_WORDS

from bot.diagnosis.budget import rules_for
from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evidence import load_bundle
from bot.diagnosis.levers import MARGIN_GIB
from bot.diagnosis.models import DiagnosisResult, Evidence, LogText
from bot.diagnosis.preflight import PlanResult, plan

MODEL = "meta-llama/Llama-3.1-70B-Instruct"
SHM = {"volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}],
       "mounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}
# vLLM 0.11.0 (the pod's image), a 70B in bf16 on one A100-80GB: PyTorch's OOM while building the layers;
# the total is the node label's 80 GiB so that both answers read the same card
WEIGHTS_OOM = """(APIServer pid=1) INFO 11-30 05:00:00 [api_server.py:1805] vLLM API server version 0.11.0
(EngineCore_DP0 pid=200) INFO 11-30 05:00:01 [core.py:77] Initializing a V1 LLM engine (v0.11.0) with config: model='meta-llama/Llama-3.1-70B-Instruct', tensor_parallel_size=1
(EngineCore_DP0 pid=200) ERROR 11-30 05:01:00 [core.py:708]   File "/usr/local/lib/python3.12/dist-packages/vllm/model_executor/models/llama.py", line 300, in __init__
(EngineCore_DP0 pid=200) ERROR 11-30 05:01:00 [core.py:708] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. GPU 0 has a total capacity of 80.00 GiB of which 500.00 MiB is free. Including non-PyTorch memory, this process has 79.50 GiB memory in use. Of the allocated memory 78.10 GiB is allocated by PyTorch, and 10.00 MiB is reserved by PyTorch but unallocated.
"""
# vLLM 0.11.0's refusal (vllm/v1/executor/multiproc_executor.py, ParallelConfig): four ranks, two devices
WORLD_TOO_BIG = """(APIServer pid=1) INFO 11-30 05:00:00 [api_server.py:1805] vLLM API server version 0.11.0
(EngineCore_DP0 pid=200) INFO 11-30 05:00:01 [core.py:77] Initializing a V1 LLM engine (v0.11.0) with config: model='meta-llama/Llama-3.1-70B-Instruct', tensor_parallel_size=2, pipeline_parallel_size=2
(EngineCore_DP0 pid=200) ERROR 11-30 05:00:05 [core.py:708] ValueError: World size (4) is larger than the number of available GPUs (2) in this node. If this is intentional and you are using:
"""


def both(log: str, args: list[str], gpus: int, **pod_kw) -> tuple[DiagnosisResult, PlanResult]:
    pod = make_pod(command=["vllm", "serve"], args=[MODEL, *args], gpus=str(gpus), **pod_kw)
    node = make_node("NVIDIA-A100-SXM4-80GB", 81920, gpus)
    return diagnose(Evidence(log=LogText(text=log), pod=pod, node=node)), plan(pod, node)


def flags(result: DiagnosisResult) -> dict[str, str | None]:
    return {c.name: c.after for c in result.changes if c.kind == "flag"}


def planned(result: PlanResult) -> dict[str, str]:
    """'--quantization fp8 with --max-model-len 9216' -> {'--quantization': 'fp8', '--max-model-len': '9216'}"""
    return dict(re.findall(r"(--[a-z-]+) (\S+)", result.change or ""))


def test_70b_on_one_a100_fp8_with_a_shorter_context_both_ways():
    diagnosed, planned_ = both(WEIGHTS_OOM, [], 1)
    assert diagnosed.cause == "weights-exceed-gpu" == planned_.crash
    assert flags(diagnosed)["--quantization"] == "fp8" and planned(planned_)["--quantization"] == "fp8"
    assert flags(diagnosed)["--max-model-len"] == planned(planned_)["--max-model-len"]
    assert int(planned(planned_)["--max-model-len"]) >= 2048
    assert planned_.change_margin_gib is not None and planned_.change_margin_gib >= MARGIN_GIB


def test_tp2_x_pp2_on_two_gpus_both_ways():
    """131 GiB of bf16 weights over two 80 GiB cards leave room for the KV cache of a shorter context
    only: TP 1 x PP 2 with it, not 'no change fits' (the answer of both before)."""
    diagnosed, planned_ = both(WORLD_TOO_BIG, ["--tensor-parallel-size", "2", "--pipeline-parallel-size", "2"], 2,
                               **SHM)
    assert diagnosed.cause == "tensor-parallel-mismatch" == planned_.crash
    assert flags(diagnosed) == {"--tensor-parallel-size": "1", "--max-model-len": planned(planned_)["--max-model-len"]}
    assert planned(planned_)["--tensor-parallel-size"] == "1"
    assert planned_.change_margin_gib is not None and planned_.change_margin_gib >= MARGIN_GIB
    assert f"fits with {planned_.change_margin_gib:.2f} GiB to spare" in diagnosed.explanation


@pytest.mark.parametrize(("version", "read", "engine"), [
    ("0.11.0", "v0", "v1"), ("0.33.0", "v0", "v1"), ("0.11.0", None, "v1"),  # V0's code is gone from 0.11.0
    ("0.9.2", "v0", "v0"), ("0.9.2", None, "v1"), ("0.7.3", None, "v0")])  # VLLM_USE_V1=0 still ran V0 to 0.10
def test_the_engine_a_release_can_run(version, read, engine):
    """A log without V1's marks (or plan's empty one) reads as V0; from 0.11.0 there is no V0 to run,
    and V0's profiling batch (max_model_len tokens up to 32K) made plan refuse shorter contexts."""
    assert rules_for(version, read).engine == engine


@pytest.mark.parametrize("vendor", ["nvidia", "amd", "intel", "ascend", "tpu"])
@pytest.mark.parametrize("devices", [1, 4, 8])
def test_every_accelerator_gets_the_same_tp_from_both(tmp_path, vendor, devices):
    """A catalogued 72B (about 136 GiB in bf16) that does not load on one device, in that device's
    own OOM words: diagnose's TP and plan's are the same number, or neither proposes one."""
    resource, labels = VENDORS[vendor]
    pod = vendor_pod(resource)
    pod["spec"]["containers"][0]["args"] = ["Qwen/Qwen2.5-72B-Instruct"]
    node = vendor_node(resource, labels, devices)
    diagnosed = diagnose(load_bundle(write_bundle(tmp_path / "b", LOADING + OWN_WORDS[vendor] + "\n", pod, node)))
    planned_ = plan(pod, node)
    assert diagnosed.cause == "weights-exceed-gpu" == planned_.crash
    tp = planned(planned_).get("--tensor-parallel-size")
    assert flags(diagnosed).get("--tensor-parallel-size") == tp
    if tp is not None:
        assert int(tp) <= devices
        assert {c.name: c.after for c in diagnosed.changes if c.kind == "resources"} == {f"limits.{resource}": tp}
