"""Messy logs never crash the diagnoser: fragments of real messages with odd numbers, cut anywhere."""

from __future__ import annotations

import logging
from contextlib import contextmanager

from builders import make_node, make_pod
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.models import Evidence, LogText

FRAGMENTS = [
    "Model loading took {f} GiB and 3.1 seconds", "# GPU blocks: {i}, # CPU blocks: {i}", "GPU KV cache size: {i} tokens",
    "Maximum concurrency for {i} tokens per request: {f}x", "Available KV cache memory: {f} GiB",
    "ValueError: The model's max seq len ({i}) is larger than the maximum number of tokens that can be stored in KV cache ({i}).",
    "To serve at least one request with the models's max seq len ({i}), ({f} GiB KV cache is needed, which is larger than "
    "the available KV cache memory ({f} GiB). Based on the available memory, the estimated maximum model length is {i}.",
    "No available memory for the cache blocks.", "Free memory on device ({f}/{f} GiB) on startup is less than desired GPU "
    "memory utilization ({f}, {f} GiB).", "CUDA out of memory occurred when warming up sampler with {i} dummy requests.",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {f} GiB. GPU 0 has a total capacity of {f} GiB of which "
    "{f} MiB is free. Process {i} has {f} GiB memory in use. Of the allocated memory {f} GiB is allocated by PyTorch, and "
    "{f} MiB is reserved by PyTorch but unallocated.",
    "CUDA out of memory. Tried to allocate {f} MiB (GPU 0; {f} GiB total capacity; {f} GiB already allocated; {f} MiB "
    "free; {f} GiB reserved in total by PyTorch)", "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 50%",
    "World size ({i}) is larger than the number of available GPUs ({i}) in this node.",
    "Insufficient space in /dev/shm: {i} MiB required, {i} MiB free.", "Killed", "KeyboardInterrupt: terminated",
    '  File "/x/vllm/v1/worker/gpu_model_runner.py", line 1, in capture_model', "Traceback (most recent call last):",
    "Initializing an LLM engine (v0.6.3) with config: model='m-7B', max_seq_len={i}, tensor_parallel_size={i}, dtype=torch.float32",
    "the current vLLM instance can use total_gpu_memory ({f}GiB) x gpu_memory_utilization ({f}) = {f}GiB",
    "model weights take {f}GiB; non_torch_memory takes {f}GiB; PyTorch activation peak memory takes {f}GiB; the rest of the "
    "memory reserved for KV Cache is {f}GiB.",
]

numbers = st.one_of(st.integers(min_value=0, max_value=10**7), st.floats(min_value=0, max_value=1e6, allow_nan=False))


@st.composite
def logs(draw):
    lines = []
    for _ in range(draw(st.integers(min_value=1, max_value=12))):
        text = draw(st.sampled_from(FRAGMENTS))
        while "{i}" in text or "{f}" in text:
            n = draw(numbers)
            text = text.replace("{i}", str(int(n)), 1) if text.find("{i}") != -1 and (
                text.find("{f}") == -1 or text.find("{i}") < text.find("{f}")) else text.replace("{f}", f"{float(n):.2f}", 1)
        cut = draw(st.integers(min_value=0, max_value=len(text)))
        lines.append(text[: cut or len(text)])
    return "\n".join(lines) + "\n"


class _Swallowed(logging.Handler):
    """Collects what the diagnoser caught and logged instead of raising: a formula that failed on
    numbers it did not expect. The diagnosis survives it, but it is a bug to fix, not noise."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def swallowed_errors():
    handler = _Swallowed()
    logger = logging.getLogger("bot.diagnosis")
    logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=logs(), tp=st.sampled_from(["1", "2", "8"]), gpus=st.sampled_from(["1", "2", "0"]))
def test_diagnose_never_raises(log, tp, gpus):
    pod = make_pod(command=["/bin/sh", "-c"], args=[f"vllm serve m-7B --tensor-parallel-size {tp} --max-model-len 4096"],
                   gpus=gpus)
    with swallowed_errors() as errors:
        result = diagnose(Evidence(log=LogText(text=log), pod=pod, node=make_node()))
    assert not errors, f"the diagnoser swallowed: {errors}"
    assert result.title
    if result.cause is None:
        assert result.changes == []
