"""Log text is input, not truth: a user's prompt printed by vLLM's request logger can quote any
vLLM or PyTorch message, and must never become a fact, an error, a stage or evidence. Lines are
read between where vLLM's or PyTorch's own message starts (its prefixes optional, as real pastes
strip them) and the first request payload marker."""

from __future__ import annotations

import pytest
from builders import make_node, make_pod

from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.logfacts import extract
from bot.diagnosis.logformats import PAYLOAD, PAYLOAD_LITERALS, PAYLOAD_MARKS, first_mark, message_span
from bot.diagnosis.models import Evidence, LogText

KV_ERROR = ("ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be "
            "stored in KV cache (1024). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
            "initializing the engine.")
V1_ERROR = ("ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is "
            "needed, which is larger than the available KV cache memory (2.34 GiB). Based on the available memory, the "
            "estimated maximum model length is 1024. Try increasing `gpu_memory_utilization`.")
TORCH_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
             "79.15 GiB of which 1.00 GiB is free.")

# vLLM's request logger lines (0.4-0.10 and 0.11+ shapes, outputs), a uvicorn access line, each
# carrying the quoted error; with and without the prefixes real pastes keep or lose.
PAYLOAD_LINES = [
    f"INFO 06-01 10:00:00 [logger.py:39] Received request cmpl-1-0: prompt: {KV_ERROR!r}, params: "
    "SamplingParams(n=1, max_tokens=16), prompt_token_ids: [1, 2, 3], lora_request: None.",
    f"(APIServer pid=1) INFO 06-01 10:00:00 [logger.py:49] Received request chatcmpl-9: prompt: {V1_ERROR!r}, "
    "params: SamplingParams(n=1), prompt_token_ids: None",
    f"2026-06-01T10:00:00.123456789Z DEBUG 06-01 10:00:00 [logger.py:50] Request cmpl-2 details: prompt: "
    f"{TORCH_OOM!r}, prompt_token_ids: [1], prompt_embeds shape: None.",
    f"Received request cmpl-3: prompt: '{KV_ERROR}'",  # prefixes stripped by the paste
    f"vllm-1  | INFO 06-01 10:00:00 [logger.py:39] Received request cmpl-4: prompt: '{V1_ERROR}'",
    f"INFO 06-01 10:00:01 [logger.py:70] Generated response cmpl-5: output: {KV_ERROR!r}, output_token_ids: [5], "
    "finish_reason: stop",
    f'INFO:     10.0.0.7:51234 - "POST /v1/{KV_ERROR.replace(" ", "_")} HTTP/1.1" 404 Not Found',
]


@pytest.mark.parametrize("line", PAYLOAD_LINES, ids=range(len(PAYLOAD_LINES)))
def test_a_quoted_message_in_a_request_payload_yields_nothing(line):
    facts = extract(LogText(text=line + "\n"))
    assert facts.facts == {} and facts.errors == [] and facts.markers == {}
    assert all("1024" not in text and "20.00 GiB" not in text for _, text in facts.hit_lines)
    assert all("1024" not in text for text in facts.tail + facts.head)


@pytest.mark.parametrize("line", [
    KV_ERROR,
    f"ERROR 04-17 15:10:09 [engine.py:448] {KV_ERROR}",
    f"(VllmWorker TP0 pid=87) ERROR 04-17 15:10:09 [engine.py:448] {KV_ERROR}",
    f"(EngineCore_DP0 pid=87) {KV_ERROR}",
    f"(RayWorkerWrapper pid=4123, ip=10.0.0.2) ERROR 04-17 15:10:09 worker_base.py:382] {KV_ERROR}",
    f"2026-06-01T10:00:00.123Z ERROR 04-17 15:10:09 [engine.py:448] {KV_ERROR}",
    f"vllm-1  | {KV_ERROR}",
], ids=["bare", "logger", "worker", "engine-core", "ray", "kubectl", "docker"])
def test_vllm_s_own_message_is_read_with_or_without_its_prefixes(line):
    facts = extract(LogText(text=line + "\n"))
    assert facts.get("required_len") == 32768 and facts.get("kv_capacity_tokens") == 1024
    assert [e.value for e in facts.errors] == ["ValueError"]


def test_the_message_before_a_payload_marker_is_read_and_the_payload_is_not():
    line = f"ERROR 06-01 10:00:00 [serving.py:1] {TORCH_OOM} prompt: {KV_ERROR!r}"
    facts = extract(LogText(text=line + "\n"))
    assert facts.get("oom_tried_gib") == 20.0 and facts.get("required_len") is None
    assert all("1024" not in text for _, text in facts.hit_lines)


def test_every_payload_mark_is_cut_at_its_start():
    for mark in PAYLOAD_MARKS:
        assert mark.versions and mark.source
    start, end = message_span("(EngineCore_DP0 pid=87) INFO 06-01 10:00:00 [logger.py:39] Received request x: prompt: 'y'")
    assert start == end


# (line, where its first mark starts): a `\b` mark after a letter, a digit, `_` or a non-ASCII letter
# is none; the earliest of several marks wins, whichever mark comes first in PAYLOAD_MARKS
FIRST_MARKS = [
    ("prompt: x", 0), ("say prompt: x", 4), ("xprompt: x", None), ("_prompt: x", None), ("\u00e9prompt: x", None),
    ("1output: y", None), ("-output: y", 1), ("output_token_ids: [1]", 0), ("xprompt: a prompts: b", 11),
    ('a "GET /x HTTP/1.1" prompt: z', 2), ("Generated text", 0), ("the output is a prompt", None), ("", None),
    ("x Received request cmpl-1: prompt: 'y'", 2), ("prompt_embeds shape: None output: z", 0),
]


@pytest.mark.parametrize("line, start", FIRST_MARKS)
def test_the_first_mark_is_where_the_marks_alternation_first_matches(line, start):
    """first_mark searches the marks one by one (a leading \\b checked by hand, issue 20): it must
    find what PAYLOAD, their alternation, finds."""
    found = PAYLOAD.search(line)
    assert first_mark(line) == start == (found.start() if found is not None else None)


def test_a_mark_inside_the_prefixes_does_not_end_the_message():
    """A process name may hold a mark's text ('(prompt: x pid=1)'): the message is still read, up
    to the first mark after the prefixes."""
    line = "(prompt: x pid=1) INFO 06-01 10:00:00 [core.py:1] Model loading took 2.00 GiB"
    start, end = message_span(line)
    assert line[start:end] == "Model loading took 2.00 GiB"
    start, end = message_span(line + " output: 'y'")
    assert (line + " output: 'y'")[start:end] == "Model loading took 2.00 GiB "


def top_level_alternatives(pattern: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(pattern):
        depth += {"(": 1, ")": -1}.get(ch, 0) if i == 0 or pattern[i - 1] != "\\" else 0
        if ch == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
    return [*parts, pattern[start:]]


def test_every_payload_mark_holds_one_of_the_literals_the_prefilter_looks_for():
    """trusted_text skips the marks' regex on a line without any PAYLOAD_LITERALS: each mark (each
    of its alternatives) must spell one of them in its pattern, or its lines would be let through."""
    for mark in PAYLOAD_MARKS:
        for alternative in top_level_alternatives(mark.pattern):
            assert any(literal in alternative for literal in PAYLOAD_LITERALS), (mark.name, alternative)
    for line in PAYLOAD_LINES:
        assert any(literal in line for literal in PAYLOAD_LITERALS), line


ATTACK_LOG = "\n".join([
    "INFO 06-01 09:59:00 [api_server.py:1971] vLLM API server version 0.11.0",
    "INFO 06-01 09:59:30 [gpu_model_runner.py:2653] Model loading took 14.99 GiB and 8.2 seconds",
    "INFO 06-01 09:59:40 [gpu_worker.py:298] Available KV cache memory: 55.10 GiB",
    "INFO 06-01 09:59:40 [kv_cache_utils.py:864] GPU KV cache size: 451,392 tokens",
    "INFO 06-01 09:59:40 [kv_cache_utils.py:868] Maximum concurrency for 32,768 tokens per request: 13.78x",
    "INFO 06-01 09:59:50 [api_server.py:1000] Starting vLLM API server 0 on http://0.0.0.0:8000",
    "INFO:     Application startup complete.",
    *PAYLOAD_LINES,
]) + "\n"


def test_a_prompt_quoting_the_kv_cache_error_does_not_pick_the_fix(tmp_path):
    """Issue 17 item 4: the pod was OOMKilled after serving; the prompt quoted 'KV cache (1024)'."""
    pod = make_pod(args=["--model", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "32768"],
                   exit_code=137, reason="OOMKilled")
    log = tmp_path / "previous.log"
    log.write_text(ATTACK_LOG)
    result = diagnose(Evidence(log=LogText(path=log), pod=pod, node=make_node(product="NVIDIA-H100-80GB-HBM3",
                                                                                memory_mib=81559)))
    assert result.cause != "kv-cache-max-model-len", result.cause
    assert "1024" not in result.explanation
    assert all(c.after != "1024" for c in result.changes), result.changes
    assert not any("Received request" in line or "prompt:" in line for line in result.evidence), result.evidence
