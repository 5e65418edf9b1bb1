"""vLLM says what to change: the generic reader of flag bounds and the playbook that listens.

The sentences are vLLM's own wordings as its source builds them (0.33.0 wheel: config/compilation.py,
config/scheduler.py, v1/core/encoder_cache_manager.py, v1/worker/gpu_worker.py, kv_cache_planning.py);
the numbers differ from the fixture bundles so no answer is keyed to one log.
"""

from __future__ import annotations

import pytest

from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evidence import Evidence
from bot.diagnosis.logfacts import extract
from bot.diagnosis.logformats import read_flag_bounds
from bot.diagnosis.models import LogText

MAMBA = ("ValueError: max_num_seqs ({seqs}) exceeds available Mamba cache blocks ({blocks}). Each decode sequence "
         "requires one Mamba cache block, so CUDA graph capture cannot proceed. Please lower max_num_seqs to at most "
         "{blocks} or increase gpu_memory_utilization.")
BATCHED = ("ValueError: max_num_batched_tokens ({mbt}) is smaller than max_model_len ({mml}). This effectively limits "
           "the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. Please "
           "increase max_num_batched_tokens or decrease max_model_len.")
MM_ITEM = ("ValueError: Chunked MM input disabled but max_tokens_per_mm_item ({item}) is larger than "
           "max_num_batched_tokens ({mbt}). Please increase max_num_batched_tokens.")
GRAPH_HINT = ("INFO 11-29 08:15:50 [v1/worker/gpu_worker.py:495] CUDA graph memory profiling is enabled (default since "
              "v0.21.0). The current --gpu-memory-utilization=0.9000 is equivalent to --gpu-memory-utilization=0.8812 "
              "without CUDA graph memory profiling. To maintain the same effective KV cache size as before, increase "
              "--gpu-memory-utilization to 0.9188. To disable, set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0.")


@pytest.mark.parametrize(("message", "expected"), [
    (MAMBA.format(seqs=512, blocks=377), {"--max-num-seqs": {"at_most": 377}}),
    (BATCHED.format(mbt=1024, mml=8192), {"--max-num-batched-tokens": {"at_least": 8192},
                                          "--max-model-len": {"at_most": 1024}}),
    (MM_ITEM.format(item=16384, mbt=2048), {"--max-num-batched-tokens": {"at_least": 16384}}),
    (GRAPH_HINT, {"--gpu-memory-utilization": {"at_least": 0.9188}}),
    ("Based on the available memory, the estimated maximum model length is 12,288. Try increasing "
     "`gpu_memory_utilization`", {"--max-model-len": {"at_most": 12288}}),
    ("Please lower `--max-num-seqs` to no more than 48.", {"--max-num-seqs": {"at_most": 48}}),
    # the Mamba check's first sentence alone (pastes often stop there): the block count is the bound
    ("ValueError: max_num_seqs (640) exceeds available Mamba cache blocks (233).", {"--max-num-seqs": {"at_most": 233}}),
    # a quote that starts at 'exceeds': vLLM raises the sentence only from its max_num_seqs check
    ("`exceeds available Mamba cache blocks (41)... CUDA graph capture cannot proceed`", {"--max-num-seqs": {"at_most": 41}}),
])
def test_reader_takes_the_bound_from_any_wording(message: str, expected: dict) -> None:
    assert read_flag_bounds(message) == expected


@pytest.mark.parametrize("message", [
    "Try increasing `gpu_memory_utilization` when initializing the engine.",  # a direction, no number
    "Please lower made_up_setting to at most 3.",  # not a flag of any vLLM release
    "Try lowering --gpu-memory-utilization to free memory for weights",  # no number
])
def test_no_bound_without_a_flag_and_a_number(message: str) -> None:
    assert read_flag_bounds(message) == {}


def _diagnose(log: str):
    return diagnose(Evidence(log=LogText(text=log), source="test"))


def test_mamba_blocks_bound_becomes_the_proposal() -> None:
    log = ("INFO 11-29 08:14:06 [v1/engine/core.py:101] Initializing a V1 LLM engine (v0.30.0) with config: "
           "model='ibm-granite/granite-4.0-h-small', max_seq_len=32768, tensor_parallel_size=1\n"
           "(EngineCore_DP0 pid=80) " + MAMBA.format(seqs=256, blocks=121) + "\n"
           "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n")
    result = _diagnose(log)
    assert result.cause == "vllm-named-bound"
    assert [(c.name, c.after) for c in result.changes] == [("--max-num-seqs", "121")]


def test_mamba_first_sentence_alone_becomes_the_proposal() -> None:
    log = ("(EngineCore_DP0 pid=80) ValueError: max_num_seqs (640) exceeds available Mamba cache blocks (233).\n"
           "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n")
    result = _diagnose(log)
    assert result.cause == "vllm-named-bound"
    assert [(c.name, c.after) for c in result.changes] == [("--max-num-seqs", "233")]


def test_a_quoted_mamba_fragment_without_the_exception_name_is_still_the_error() -> None:
    result = _diagnose("`exceeds available Mamba cache blocks (41)... CUDA graph capture cannot proceed`\n")
    assert result.cause == "vllm-named-bound"
    assert [(c.name, c.after) for c in result.changes] == [("--max-num-seqs", "41")]


def test_hint_on_an_info_line_is_no_cause() -> None:
    # a healthy start prints the CUDA-graph hint; the crash afterwards is something else
    log = GRAPH_HINT + "\nRuntimeError: some unrelated failure\n"
    facts = extract(LogText(text=log))
    assert facts.get("vllm_bounds") == {"--gpu-memory-utilization": {"at_least": 0.9188}}
    assert facts.get("vllm_error_bounds") is None
    assert _diagnose(log).cause != "vllm-named-bound"


def test_bound_quoted_in_a_prompt_is_not_evidence() -> None:
    log = ("INFO 11-29 08:20:00 [logger.py:39] Received request chatcmpl-1: prompt: '" + MAMBA.format(seqs=9, blocks=2)
           + "', params: SamplingParams(n=1)\nValueError: something else\n")
    assert extract(LogText(text=log)).get("vllm_error_bounds") is None


def test_bound_the_pod_already_keeps_changes_nothing() -> None:
    log = ("INFO 11-29 08:14:06 [v1/engine/core.py:101] Initializing a V1 LLM engine (v0.30.0) with config: "
           "model='m', max_seq_len=4096, max_num_seqs=64\n" + MAMBA.format(seqs=256, blocks=121) + "\n")
    result = _diagnose(log)
    assert result.changes == []


def test_first_flag_vllm_names_is_the_proposal() -> None:
    log = ("(APIServer pid=1) INFO 11-29 08:14:02 [entrypoints/utils.py:301] non-default args: {'model': 'm', "
           "'max_model_len': 8192, 'max_num_batched_tokens': 1024, 'enable_chunked_prefill': False}\n"
           "(APIServer pid=1) pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig\n"
           "(APIServer pid=1)   Value error, " + BATCHED.format(mbt=1024, mml=8192)[len("ValueError: "):] + "\n")
    result = _diagnose(log)
    assert result.cause == "vllm-named-bound"
    assert [(c.name, c.after) for c in result.changes] == [("--max-num-batched-tokens", "8192")]
