"""Nothing left for the KV cache, said by the number alone: vLLM's V1 line or vllm-ascend's bytes."""

from __future__ import annotations

import pytest

from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evidence import Evidence
from bot.diagnosis.logfacts import extract
from bot.diagnosis.models import LogText

ENGINE_FAILED = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"


def test_ascend_bytes_line_is_read_in_gib() -> None:
    # vllm_ascend/worker/worker_v1.py: f"Available memory: {available_kv_cache_memory}, total memory: {total_npu_memory}"
    facts = extract(LogText(text="(EngineCore_DP0 pid=9) INFO 11-30 05:00:00 [worker_v1.py:231] "
                                 "Available memory: -1610612736, total memory: 65452113920\n"))
    assert facts.get("available_kv_gib") == pytest.approx(-1.5)
    assert facts.get("total_gpu_gib") == pytest.approx(60.96, abs=0.01)


@pytest.mark.parametrize("line", [
    "(EngineCore_DP0 pid=9) INFO 11-30 05:00:00 [worker_v1.py:231] Available memory: -1610612736, total memory: 65452113920",
    "(EngineCore_DP0 pid=9) INFO 11-30 05:00:00 [gpu_worker.py:276] Available KV cache memory: -0.75 GiB",
    "(EngineCore_DP0 pid=9) INFO 11-30 05:00:00 [worker_v1.py:231] Available memory: 0, total memory: 65452113920",
])
def test_nothing_left_then_engine_failed_is_no_kv_memory(line: str) -> None:
    result = diagnose(Evidence(log=LogText(text=line + "\n" + ENGINE_FAILED), source="test"))
    assert result.cause == "no-kv-cache-memory"


def test_negative_number_on_a_server_that_started_is_no_cause() -> None:
    log = ("INFO 11-30 05:00:00 [gpu_worker.py:276] Available KV cache memory: -0.75 GiB\n"
           "INFO 11-30 05:00:09 [api_server.py:1] Application startup complete.\n")
    assert diagnose(Evidence(log=LogText(text=log), source="test")).cause != "no-kv-cache-memory"


NEGATIVE_ONLY = ("INFO 11-30 05:00:00 [gpu_model_runner.py:1] Loading model weights took 27.5376 GB\n"
                 "INFO 11-30 05:00:09 [gpu_worker.py:276] Available KV cache memory: -0.87 GiB\n")


def _with_exit(tmp_path, exit_code: int, reason: str) -> str | None:
    from builders import make_node, make_pod, write_bundle

    from bot.diagnosis.evidence import load_bundle
    bundle = write_bundle(tmp_path / f"b{exit_code}", NEGATIVE_ONLY, make_pod(args=["Qwen/Qwen3-14B"], exit_code=exit_code,
                                                                            reason=reason), make_node())
    return diagnose(load_bundle(bundle)).cause


def test_negative_number_then_an_exception_exit_is_no_kv_memory_even_when_the_paste_stops_there(tmp_path) -> None:
    # vLLM raises 'No available memory for the cache blocks' right after printing a budget <= 0;
    # the container's exit code 1 (an uncaught exception) says that check ended it
    assert _with_exit(tmp_path, 1, "Error") == "no-kv-cache-memory"


@pytest.mark.parametrize(("exit_code", "reason"), [(137, "Error"), (137, "OOMKilled"), (0, "Completed")])
def test_negative_number_with_a_kill_or_a_clean_exit_is_not_read_as_the_kv_check(tmp_path, exit_code, reason) -> None:
    assert _with_exit(tmp_path, exit_code, reason) != "no-kv-cache-memory"


def test_negative_number_alone_without_a_pod_stays_unknown() -> None:
    assert diagnose(Evidence(log=LogText(text=NEGATIVE_ONLY), source="test")).cause is None
