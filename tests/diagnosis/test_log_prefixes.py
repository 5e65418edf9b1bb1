"""Every release's process prefixes are stripped the same way: the message starts where vLLM's does.

The prefixes are written the way each release's source builds them (see LINE_PREFIXES in
bot/diagnosis/logformats.py for the version ranges); a message behind any of them yields the
same facts as the bare message (0.33 prints tracebacks with no prefix at all).
"""

from __future__ import annotations

import pytest

from bot.diagnosis.logfacts import extract
from bot.diagnosis.logformats import message_span
from bot.diagnosis.models import LogText

PREFIXES = [
    "(VllmWorkerProcess pid=4711) ",  # V0 multiproc
    "(RayWorkerVllm pid=74362) ",  # Ray 0.2-0.3
    "(RayWorkerWrapper pid=37396, ip=10.244.1.95) ",  # Ray 0.4+
    "(VllmWorker rank=7 pid=10948) ",  # V1 0.8-0.9
    "(VllmWorker TP0 pid=10948) ",
    "(EngineCore_0 pid=512) ",  # 0.8.5
    "(EngineCore_DP0 pid=79) ",  # 0.10+
    "(EngineCore pid=79) ",
    "(Worker_TP2 pid=61) ",
    "(Worker_PP1_TP3 pid=1389) ",
    "(Worker pid=61) ",
    "(APIServer pid=1) ",
    "(ServeReplica:default:VLLMDeployment pid=12, ip=10.0.0.1) ",  # Ray Serve actor names hold ':'
    "(raylet) ",
    "(raylet, ip=10.0.0.3) ",
    "2026-03-01T10:00:00.123456789Z (EngineCore_DP0 pid=79) ",  # kubectl --timestamps
    "vllm-1  | (Worker_TP1 pid=62) ",  # docker compose
    "",  # 0.33: no prefix inside tracebacks
]
MESSAGE = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`."


@pytest.mark.parametrize("prefix", PREFIXES)
def test_message_starts_after_each_release_prefix(prefix: str) -> None:
    line = prefix + "ERROR 03-16 06:12:38 [core.py:700] " + MESSAGE
    start, end = message_span(line)
    assert line[start:end] == MESSAGE


@pytest.mark.parametrize("prefix", PREFIXES)
def test_same_facts_behind_any_prefix(prefix: str) -> None:
    facts = extract(LogText(text=prefix + MESSAGE + "\n"))
    assert facts.get("no_kv_memory") is True
    assert [e.value for e in facts.errors] == ["ValueError"]


def test_ray_cpp_log_line_is_read_from_its_message() -> None:
    line = "(raylet) [2025-06-01 10:00:00,123 E 15 15] store_runner.cc:48: Killed"
    start, end = message_span(line)
    assert line[start:end] == "Killed"


def test_a_word_in_parentheses_is_not_a_prefix() -> None:
    line = "(note) Model loading took 7.5 GiB"
    start, _ = message_span(line)
    assert start == 0
