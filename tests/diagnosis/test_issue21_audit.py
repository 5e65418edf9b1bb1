"""Issue 21's classes, each built from the wording vLLM or PyTorch prints on that device and the pod
and node as Kubernetes shows them; each asserts the cause, the change, and that the change fits
the node's real devices (docs/issue21-audit.md maps every class to its tests).

Wordings: c10/cuda/CUDACachingAllocator.cpp ('CUDA out of memory', hipified to 'HIP out of memory'
on ROCm), c10/xpu/XPUCachingAllocator.cpp ('XPU out of memory'), torch_npu's NPUCachingAllocator
(the torch 2.0 layout, '(NPU 0; ... current active; ...)'), XLA/PJRT on TPU ('RESOURCE_EXHAUSTED:
Error allocating device buffer'); vLLM 0.9-0.33's worker frames (gpu_worker.py init_device ->
torch.cuda.set_device)."""

from __future__ import annotations

import pytest
from builders import make_node, make_pod, write_bundle
from test_accelerators import VENDORS, vendor_node, vendor_pod

from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evidence import load_bundle
from bot.diagnosis.models import DiagnosisResult, Evidence, FindingKind, LogText

LOADING = '  File "/usr/local/lib/python3.12/dist-packages/vllm/model_executor/models/qwen2.py", line 300, in __init__\n'
# a 72B in bf16 (about 134 GiB) running out while its layers are built; nothing cached beside the
# allocation (not fragmentation), in each device's own words and its own total
OWN_WORDS = {
    "nvidia": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.16 GiB. GPU 0 has a total capacity of "
              "79.33 GiB of which 500.00 MiB is free. Of the allocated memory 78.33 GiB is allocated by PyTorch, and "
              "10.00 MiB is reserved by PyTorch but unallocated.",
    "amd": "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 1.16 GiB. GPU 0 has a total capacity of 63.98 "
           "GiB of which 300.00 MiB is free. Of the allocated memory 63.10 GiB is allocated by PyTorch, and 20.00 MiB is "
           "reserved by PyTorch but unallocated.",
    "intel": "torch.OutOfMemoryError: XPU out of memory. Tried to allocate 1.16 GiB. GPU 0 has a total capacity of 48.00 "
             "GiB of which 100.00 MiB is free. Of the allocated memory 47.50 GiB is allocated by PyTorch, and 20.00 MiB "
             "is reserved by PyTorch but unallocated.",
    "ascend": "RuntimeError: NPU out of memory. Tried to allocate 1.16 GiB (NPU 0; 29.50 GiB total capacity; 28.90 GiB "
              "already allocated; 28.90 GiB current active; 100.00 MiB free; 28.95 GiB reserved in total by PyTorch)",
    "tpu": "RuntimeError: RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 1.16G. That was not "
           "possible. There are 0.25G free.; (0x0x0_HBM0)",
}
# the vendor catalogue's (or label's) memory per device: the TP that holds 134 GiB at 80% of each
PER_DEVICE_GIB = {"nvidia": 80.0, "amd": 64.0, "intel": 48.0, "ascend": 32.0, "tpu": 16.0}
WEIGHTS_GIB = 134.1  # Qwen2-72B from its name: 72B parameters x 2 bytes


def device_changes(result: DiagnosisResult) -> dict[str, str | None]:
    return {c.name: c.after for c in result.changes if c.kind == "resources" and "/" in c.name}


def tp_after(result: DiagnosisResult) -> int | None:
    tp = [c.after for c in result.changes if c.name == "--tensor-parallel-size"]
    return int(tp[0]) if tp and tp[0] else None


@pytest.mark.parametrize("vendor", sorted(OWN_WORDS))
@pytest.mark.parametrize("devices", [1, 4, 8])
def test_weights_oom_in_each_devices_own_words_gets_a_change_its_node_holds(tmp_path, vendor, devices):
    resource, labels = VENDORS[vendor]
    bundle = write_bundle(tmp_path / "b", LOADING + OWN_WORDS[vendor] + "\n", vendor_pod(resource),
                          vendor_node(resource, labels, devices))
    result = diagnose(load_bundle(bundle))
    assert result.cause == "weights-exceed-gpu"
    tp = tp_after(result)
    # the smallest power of two whose devices hold the weights at 80% each; none when the node has fewer
    need = 1
    while need * 0.8 * PER_DEVICE_GIB[vendor] < WEIGHTS_GIB:
        need *= 2
    if need <= devices:
        assert tp == need, f"{vendor}: TP {tp} on {devices} x {PER_DEVICE_GIB[vendor]} GiB"
        assert device_changes(result) == {f"limits.{resource}": str(need)}
    else:  # no TP on this node holds the weights: no change, advice instead (TP 2 over 16 GiB TPU chips was proposed)
        assert tp is None and not device_changes(result), f"{vendor}: {result.changes}"
        assert result.advice
    assert not any("nvidia" in c.name for c in result.changes if vendor != "nvidia")


INVALID_ORDINAL = """INFO 11-30 05:00:01 [core.py:58] Initializing a V1 LLM engine (v0.9.1) with config: model='meta-llama/Llama-3.1-8B-Instruct', tensor_parallel_size=4
(VllmWorker rank=2 pid=311) ERROR 11-30 05:00:09 [multiproc_executor.py:527]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_worker.py", line 160, in init_device
(VllmWorker rank=2 pid=311) ERROR 11-30 05:00:09 [multiproc_executor.py:527]     torch.cuda.set_device(self.device)
(VllmWorker rank=2 pid=311) ERROR 11-30 05:00:09 [multiproc_executor.py:527] torch.AcceleratorError: CUDA error: invalid device ordinal
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_invalid_device_ordinal_with_tp_above_the_pod_is_the_tp_cause_and_shm_is_also_named():
    pod = make_pod(command=["vllm", "serve"], args=["meta-llama/Llama-3.1-8B-Instruct", "--tensor-parallel-size", "4"],
                   gpus="2")
    result = diagnose(Evidence(log=LogText(text=INVALID_ORDINAL), pod=pod,
                               node=make_node("NVIDIA-A100-SXM4-80GB", 81920, 8)))
    assert result.cause == "tensor-parallel-mismatch"
    assert [(c.name, c.after) for c in result.changes] == [("--tensor-parallel-size", "2")]
    kinds = {f.kind for f in result.findings}
    assert FindingKind.SHM_MISSING in kinds  # TP 2 still needs /dev/shm: named beside the cause
    assert FindingKind.PARALLEL_ABOVE_POD_DEVICES not in kinds  # the cause itself, not repeated


ROOT = "/usr/local/lib/python3.12/dist-packages/vllm"
CUT_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of "
           "22.05 GiB of which 301.12 MiB is free. Including non-PyTorch memory, this process has 21.74 GiB memory in "
           "use. Of the allocated memory 20.90 GiB is allocated by PyTorch, with 210.00 MiB allocated in private pools "
           "(e.g., CUDA Graphs), and 318.55 MiB is reserved by PyTorch but unallocated.")


def frames(*calls: tuple[str, str]) -> str:
    return "".join(f'(EngineCore pid=79)   File "{ROOT}/{path}", line 1, in {func}\n(EngineCore pid=79)     x()\n'
                   for path, func in calls)


@pytest.mark.parametrize(("calls", "cause", "change"), [
    ((("v1/worker/gpu_worker.py", "determine_available_memory"), ("v1/worker/gpu_model_runner.py", "profile_cudagraph_memory"),
      ("v1/worker/gpu_model_runner.py", "_dummy_run")), "cuda-graph-capture", ("--enforce-eager", "true")),
    ((("v1/worker/gpu_worker.py", "compile_or_warm_up_model"), ("v1/worker/gpu_model_runner.py", "capture_model"),
      ("v1/worker/gpu_model_runner.py", "_capture_cudagraphs")), "cuda-graph-capture", ("--enforce-eager", "true")),
    ((("v1/worker/gpu_worker.py", "determine_available_memory"), ("v1/worker/gpu_model_runner.py", "profile_run"),
      ("v1/worker/gpu_model_runner.py", "_dummy_run")), "profiling-activation-oom", ("--max-num-batched-tokens", "1024")),
], ids=["graph-profiling", "graph-capture", "profiling"])
def test_stage_cut_off_oom_gets_the_stages_change_on_one_l4(calls, cause, change):
    """No 'Capturing CUDA graphs' or profiling line, only the frames: the stage's own change, on the
    one card the pod has (never more devices for a start-up stage's OOM)."""
    log = ("(APIServer pid=1) INFO 11-30 05:00:00 [api_server.py:1805] vLLM API server version 0.33.0\n"
           + frames(*calls) + "(EngineCore pid=79) " + CUT_OOM + "\n")
    pod = make_pod(command=["vllm", "serve"], args=["meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "16384"])
    pod["spec"]["containers"][0]["image"] = "vllm/vllm-openai:v0.33.0"
    result = diagnose(Evidence(log=LogText(text=log), pod=pod, node=make_node("NVIDIA-L4", 23034, 1)))
    assert result.cause == cause
    assert [(c.name, c.after) for c in result.changes] == [change]
    assert not device_changes(result) and tp_after(result) is None
