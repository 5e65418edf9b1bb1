"""--cpu-offload-gb when the weights cannot fit the node's devices but the host memory holds the
offloaded part (issue 21): proposed with its arithmetic, never past the host or the PCIe bound."""

from __future__ import annotations

from builders import make_node, make_pod
from test_formulas import context, run, value_and_sentence

from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.models import Evidence, LogText

# PyTorch 2.0's OOM wording while vLLM loads a 7B model in fp16 on one 11 GB card
LOG = """INFO 06-21 10:00:00 llm_engine.py:60] Initializing an LLM engine with config: model='mistralai/Mistral-7B-v0.1', dtype=torch.float16, tensor_parallel_size=1, seed=0)
Traceback (most recent call last):
  File "/usr/local/lib/python3.10/site-packages/vllm/model_executor/model_loader.py", line 50, in get_model
    model = model_class(model_config.hf_config)
torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 224.00 MiB (GPU 0; 10.73 GiB total capacity; 9.85 GiB already allocated; 46.44 MiB free; 9.86 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.
"""
ARGS = ["mistralai/Mistral-7B-v0.1", "--dtype", "half", "--gpu-memory-utilization", "0.8", "--max-model-len", "4096"]
NODE = make_node("NVIDIA-GeForce-RTX-2080-Ti", memory_mib=11264, count=1)


def _diagnose(memory: str):
    pod = make_pod(command=["vllm", "serve"], args=ARGS, memory=memory)
    return diagnose(Evidence(log=LogText(text=LOG), pod=pod, node=NODE))


def test_offload_proposed_when_the_host_holds_it():
    result = _diagnose("64Gi")
    assert result.cause == "weights-exceed-gpu"
    changes = {c.name: (c.before, c.after) for c in result.changes}
    assert changes["--cpu-offload-gb"] == (None, "9")  # 14.84 - 6.58 = 8.26 -> 9 GiB
    assert changes["--gpu-memory-utilization"] == ("0.8", "0.75")  # the margin beside non-PyTorch memory
    assert "14.84 - 6.58 = 8.26, rounded up: offload 9 GiB" in result.explanation
    assert "within 60% of the container's memory limit (64.00 GiB x 0.6 = 38.40 GiB)" in result.explanation
    assert "--cpu-offload-gb 9" in " ".join(result.command_after)


def test_no_offload_when_the_host_cannot_hold_it():
    result = _diagnose("12Gi")  # 9 GiB > 60% of 12 GiB
    assert not any(c.name == "--cpu-offload-gb" for c in result.changes)


def test_offload_bounded_by_pcie_and_host():
    node = make_node(allocatable_memory="251Gi")
    # 18 GiB of 44 on an L4 would stream 26 GiB over PCIe per forward pass: no fix
    assert run("cpu_offload_for_weights", context({"weights_estimate_gib": 40.0, "gpu_total_gib": 22.49,
                                                   "gpu_memory_utilization": 0.9}, node=node)) is None
    # a third of the weights offloaded, host memory known and large enough: proposed
    ctx = context({"weights_estimate_gib": 24.0, "gpu_total_gib": 22.49, "gpu_memory_utilization": 0.9}, node=node)
    before, after, sentence = value_and_sentence("cpu_offload_for_weights", ctx)
    assert after == "9"  # 26.4 - 18.24 = 8.16 -> 9
    assert "the node's allocatable memory (251.0 GiB x 0.6 = 150.6 GiB)" in sentence
    # the same with a host too small for it
    ctx = context({"weights_estimate_gib": 24.0, "gpu_total_gib": 22.49, "gpu_memory_utilization": 0.9,
                   "memory_limit_bytes": 8 * 2**30}, node=node)
    assert run("cpu_offload_for_weights", ctx) is None


def test_unknown_model_weights_come_from_the_model_loading_line():
    """A name the catalogue does not know: the log's "Model loading took X GiB" is the weights figure."""
    log = ("INFO 11-30 05:00:01 [core.py:58] Initializing a V1 LLM engine (v0.9.1) with config: model='/models/acme-internal', "
           "tensor_parallel_size=1\n"
           "INFO 11-30 05:01:10 [gpu_model_runner.py:1595] Model loading took 30.52 GiB and 41.0 seconds\n"
           "ERROR 11-30 05:01:20 [core.py:515] ValueError: To serve at least one request with the models's max seq len "
           "(131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (9.10 GiB). "
           "Based on the available memory, the estimated maximum model length is 74496. Try increasing "
           "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.\n")
    pod = make_pod(command=["vllm", "serve"], args=["/models/acme-internal", "--max-model-len", "131072"])
    node = make_node("NVIDIA-A100-SXM4-80GB", memory_mib=81920, count=1)
    result = diagnose(Evidence(log=LogText(text=log), pod=pod, node=node))
    assert result.cause == "kv-cache-max-model-len"
    assert "Model loading took 30.52 GiB" in result.memory_picture
