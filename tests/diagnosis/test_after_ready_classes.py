"""Crashes after Ready (issue 21): an EngineDeadError with no OOM line, on the first request to a
server whose /health said 200. What vLLM prints before it decides the cause: with
VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 it warns that --max-model-len is above the model's context
(vllm@v0.10.1 vllm/config/__init__.py:2961, vllm@v0.33.0 vllm/config/model.py:2663-2678), starts,
and the first long request fails a kernel's index assertion; EngineCore logs 'EngineCore
encountered a fatal error.' (v1/engine/core.py) and the API server 'AsyncLLM output_handler
failed.' then EngineDeadError (v1/engine/async_llm.py)."""

from __future__ import annotations

import pytest
from builders import make_node, make_pod, write_bundle
from test_accelerators import VENDORS, vendor_node, vendor_pod

from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evidence import load_bundle
from bot.diagnosis.models import DiagnosisResult, Evidence, LogText

MODEL = "Qwen/Qwen3-32B"
WARNING_0_10 = ("(APIServer pid=1) WARNING 05-22 10:00:05 [config.py:2961] User-specified max_model_len (131072) is "
                "greater than the derived max_model_len (max_position_embeddings=40960 or model_max_length=None in "
                "model's config.json). This may lead to incorrect model outputs or CUDA errors. Make sure the value "
                "is correct and within the model context size.")
WARNING_0_33 = ("(APIServer pid=1) WARNING 05-22 10:00:05 [model.py:2677] User-specified max_model_len (131072) is "
                "greater than the derived max_model_len (max_position_embeddings=40960 or model_max_length=None in "
                "model's config.json). VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. If the model "
                "uses relative position encoding (RoPE), positions exceeding derived_max_model_len lead to nan. If the "
                "model uses absolute position encoding, positions exceeding derived_max_model_len will cause a CUDA "
                "array out-of-bounds error.")
REFUSAL_0_33 = ("(APIServer pid=1) ValueError: User-specified max_model_len (131072) is greater than the derived "
                "max_model_len (max_position_embeddings=40960 or model_max_length=None in model's config.json). To "
                "allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. "
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. If the model uses relative position "
                "encoding (RoPE), positions exceeding derived_max_model_len lead to nan.")
START = """INFO 05-22 10:00:01 [__init__.py:241] Automatically detected platform cuda.
(APIServer pid=1) INFO 05-22 10:00:02 [api_server.py:1805] vLLM API server version 0.10.1
{warning}
(EngineCore_0 pid=200) INFO 05-22 10:00:09 [core.py:74] Initializing a V1 LLM engine (v0.10.1) with config: model='Qwen/Qwen3-32B', max_seq_len=131072, tensor_parallel_size=1
(EngineCore_0 pid=200) INFO 05-22 10:14:10 [gpu_model_runner.py:1892] Model loading took 61.03 GiB and 840.2 seconds
"""
# a first request past the model's positions: the server had answered /health with 200 (uvicorn's
# access log is never read: its path is the client's)
FIRST_REQUEST_DIES = """(APIServer pid=1) INFO:     Application startup complete.
(APIServer pid=1) INFO:     10.0.0.5:40000 - "GET /health HTTP/1.1" 200 OK
(APIServer pid=1) INFO:     10.0.0.9:51000 - "POST /v1/chat/completions HTTP/1.1" 200 OK
/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:94: operator(): block: [5,0,0], thread: [64,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.
(EngineCore_0 pid=200) ERROR 05-22 10:20:00 [dump_input.py:69] Dumping input data for V1 LLM engine (v0.10.1) with config: model='Qwen/Qwen3-32B',
(EngineCore_0 pid=200) ERROR 05-22 10:20:00 [core.py:702] EngineCore encountered a fatal error.
(EngineCore_0 pid=200) ERROR 05-22 10:20:00 [core.py:702] Traceback (most recent call last):
(EngineCore_0 pid=200) ERROR 05-22 10:20:00 [core.py:702]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 693, in run_engine_core
(EngineCore_0 pid=200) ERROR 05-22 10:20:00 [core.py:702] RuntimeError: CUDA error: device-side assert triggered
(APIServer pid=1) ERROR 05-22 10:20:00 [async_llm.py:430] AsyncLLM output_handler failed.
(APIServer pid=1) ERROR 05-22 10:20:00 [async_llm.py:430] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
"""
# the same warning, and the weights never fit: that crash is the weights', not the context's
WEIGHTS_OOM = """(EngineCore_0 pid=200) ERROR 05-22 10:01:00 [core.py:700]   File "/usr/local/lib/python3.12/dist-packages/vllm/model_executor/models/qwen3.py", line 300, in __init__
(EngineCore_0 pid=200) ERROR 05-22 10:01:00 [core.py:700] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.16 GiB. GPU 0 has a total capacity of 44.34 GiB of which 500.00 MiB is free. Including non-PyTorch memory, this process has 43.80 GiB memory in use. Of the allocated memory 43.33 GiB is allocated by PyTorch, and 10.00 MiB is reserved by PyTorch but unallocated.
"""


def run(log: str, product: str = "NVIDIA-H100-80GB-HBM3", memory_mib: int = 81559) -> DiagnosisResult:
    pod = make_pod(command=["vllm", "serve"], args=[MODEL, "--max-model-len", "131072"],
                   env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    return diagnose(Evidence(log=LogText(text=log), pod=pod, node=make_node(product, memory_mib, 1)))


# the shape users paste (timothystewart6/vllm-gb10 PR 8): a Triton kernel's assertion, then the C++
# runtime aborting the engine with the CUDA error, no Python traceback
TRITON_ABORT = """(APIServer pid=1) INFO:     Application startup complete.
(APIServer pid=1) INFO:     10.0.0.9:51000 - "POST /v1/chat/completions HTTP/1.1" 200 OK
/tmp/torchinductor_root/ab/cabc.py:42: unknown: block: [0,0,0], thread: [0,0,0] Assertion `index out of bounds: 0 <= tmp16 < 40960` failed.
terminate called after throwing an instance of 'c10::AcceleratorError'
  what():  CUDA error: device-side assert triggered
(APIServer pid=1) ERROR 05-22 10:20:01 [core_client.py:564] Engine core proc EngineCore_0 died unexpectedly, shutting down client.
"""


@pytest.mark.parametrize("warning", [WARNING_0_10, WARNING_0_33], ids=["0.10", "0.33"])
@pytest.mark.parametrize("death", [FIRST_REQUEST_DIES, TRITON_ABORT], ids=["traceback", "triton-abort"])
def test_first_request_past_an_allowed_long_context_is_the_context(warning, death):
    result = run(START.format(warning=warning) + death)
    assert result.cause == "max-model-len-above-model"
    assert [(c.name, c.before, c.after) for c in result.changes] == [("--max-model-len", "131072", "40960")]
    assert "first request" in result.explanation and "refuses to start." not in result.explanation
    assert any("device-side assert" in line or "index out of bounds" in line for line in result.evidence)


def test_the_refusal_is_still_the_cause_without_a_request():
    result = run(START.format(warning=REFUSAL_0_33).replace("(EngineCore_0", "#", 2))
    assert result.cause == "max-model-len-above-model"
    assert "so vLLM refuses to start" in result.explanation


@pytest.mark.parametrize("warning", [WARNING_0_10, WARNING_0_33], ids=["0.10", "0.33"])
def test_an_allowed_long_context_does_not_claim_a_weights_oom(warning):
    """The warning sits in every log of that pod: an OOM while loading on an L40S stays the weights'
    cause, never a --max-model-len cut to the model's context (a wrong confident fix)."""
    result = run(START.format(warning=warning).split("(EngineCore_0 pid=200) INFO 05-22 10:14")[0] + WEIGHTS_OOM,
                 "NVIDIA-L40S", 46068)
    assert result.cause == "weights-exceed-gpu"
    assert ("--max-model-len", "40960") not in [(c.name, c.after) for c in result.changes]


def test_the_allowed_warning_alone_is_no_cause_after_a_clean_start():
    """Killed after ready with no kernel assertion (a rollout's SIGTERM): the warning is not the crash."""
    log = START.format(warning=WARNING_0_10) + FIRST_REQUEST_DIES.split("/pytorch")[0] + "(APIServer pid=1) INFO:     Shutting down\n"
    assert run(log).cause != "max-model-len-above-model"


def test_engine_dead_after_health_200_without_a_known_cause_quotes_the_root_cause():
    """No long-context warning and no OOM: no known cause, no change, and the evidence is the
    EngineCore's own error, not only the EngineDeadError wrapper; the explanation says it had served."""
    result = run(START.format(warning="") + FIRST_REQUEST_DIES)
    assert result.cause is None and result.changes == []
    assert "started and reported ready, then failed while serving" in result.explanation
    assert any(line.endswith("RuntimeError: CUDA error: device-side assert triggered") for line in result.evidence)


RUNTIME_FRAGMENTED = """(APIServer pid=1) INFO 05-22 10:00:02 [api_server.py:1805] vLLM API server version 0.10.1
(EngineCore_0 pid=200) INFO 05-22 10:00:09 [core.py:74] Initializing a V1 LLM engine (v0.10.1) with config: model='Qwen/Qwen2.5-7B-Instruct', tensor_parallel_size=1
(APIServer pid=1) INFO:     Application startup complete.
(EngineCore_0 pid=200) ERROR 05-22 15:00:00 [core.py:702] EngineCore encountered a fatal error.
(EngineCore_0 pid=200) ERROR 05-22 15:00:00 [core.py:702] torch.OutOfMemoryError: {device} out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 63.98 GiB of which 1.20 GiB is free. Of the allocated memory 50.10 GiB is allocated by PyTorch, and 12.30 GiB is reserved by PyTorch but unallocated.
(APIServer pid=1) ERROR 05-22 15:00:00 [async_llm.py:430] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
"""


@pytest.mark.parametrize(("vendor", "device", "variable"), [("nvidia", "CUDA", "PYTORCH_CUDA_ALLOC_CONF"),
                                                             ("amd", "HIP", "PYTORCH_HIP_ALLOC_CONF")])
def test_fragmentation_hours_after_start_sets_the_devices_allocator_variable(tmp_path, vendor, device, variable):
    """Five hours after ready, 12.3 GiB cached beside a 2 GiB request: fragmentation, not the
    run-time OOM's utilization cut, in the pod's own device's variable."""
    resource, labels = VENDORS[vendor]
    pod = vendor_pod(resource)
    pod["spec"]["containers"][0]["args"] = ["Qwen/Qwen2.5-7B-Instruct"]
    bundle = write_bundle(tmp_path / "b", RUNTIME_FRAGMENTED.format(device=device), pod,
                          vendor_node(resource, labels, 1))
    result = diagnose(load_bundle(bundle))
    assert result.cause == "allocator-fragmentation"
    assert [(c.kind, c.name, c.after) for c in result.changes] == [("env", variable, "expandable_segments:True")]
