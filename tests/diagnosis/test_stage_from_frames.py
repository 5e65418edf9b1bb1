"""The stage line is cut off: where the OOM happened is read from the traceback frames alone.

Function names from vLLM 0.33.0's source (vllm/v1/worker/gpu_worker.py determine_available_memory ->
gpu_model_runner.py profile_cudagraph_memory, 0.19+ CUDA-graph memory profiling before KV sizing).
"""

from __future__ import annotations

import pytest

from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evidence import Evidence
from bot.diagnosis.models import LogText

ROOT = "/usr/local/lib/python3.12/dist-packages/vllm"
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 22.05 GiB "
       "of which 301.12 MiB is free. Including non-PyTorch memory, this process has 21.74 GiB memory in use. Of the "
       "allocated memory 20.90 GiB is allocated by PyTorch, with 210.00 MiB allocated in private pools (e.g., CUDA "
       "Graphs), and 318.55 MiB is reserved by PyTorch but unallocated.")


def frames(*calls: tuple[str, str]) -> str:
    return "".join(f'(EngineCore pid=79)   File "{ROOT}/{path}", line 1, in {func}\n(EngineCore pid=79)     x()\n'
                   for path, func in calls)


@pytest.mark.parametrize(("calls", "cause", "stage"), [
    ((("v1/worker/gpu_worker.py", "determine_available_memory"),
      ("v1/worker/gpu_model_runner.py", "profile_cudagraph_memory"),
      ("v1/worker/gpu_model_runner.py", "_dummy_run")), "cuda-graph-capture", "graph_capture"),
    ((("v1/worker/gpu_worker.py", "determine_available_memory"),
      ("v1/worker/gpu_model_runner.py", "profile_run"),
      ("v1/worker/gpu_model_runner.py", "_dummy_run")), "profiling-activation-oom", "profiling"),
    ((("v1/worker/gpu_worker.py", "compile_or_warm_up_model"),
      ("v1/worker/gpu_model_runner.py", "capture_model"),
      ("v1/worker/gpu_model_runner.py", "_capture_cudagraphs")), "cuda-graph-capture", "graph_capture"),
])
def test_stage_and_cause_from_frames_without_a_stage_line(calls, cause, stage) -> None:
    result = diagnose(Evidence(log=LogText(text=frames(*calls) + "(EngineCore pid=79) " + OOM + "\n"), source="test"))
    assert (result.cause, result.stage) == (cause, stage)
