"""`vllm-oncall diagnose` and `eval` as a user runs them: bad input gets a clear outcome, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from builders import make_node, make_pod, write_bundle

V1_MAXLEN = ("(EngineCore_DP0 pid=61) ERROR 06-01 10:00:12 [core.py:708] ValueError: To serve at least one request with the "
             "models's max seq len (32768), (4.00 GiB KV cache is needed, which is larger than the available KV cache memory "
             "(2.34 GiB). Based on the available memory, the estimated maximum model length is 19152. Try increasing "
             "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.\n")


def run(*args: str):
    proc = subprocess.run([sys.executable, "-m", "bot.cli", *args], capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def test_json_output_has_the_documented_fields(tmp_path):
    bundle = write_bundle(tmp_path / "b", V1_MAXLEN, make_pod(command=["vllm", "serve"], args=["meta-llama/Llama-3.1-8B",
                                                                                              "--max-model-len=32768"]), make_node())
    code, out, err = run("diagnose", str(bundle), "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["cause"] == "kv-cache-max-model-len"
    assert doc["changes"] == [{"kind": "flag", "name": "--max-model-len", "before": "32768", "after": "18432"}]
    assert "19,152" in doc["explanation"] and "18,432" in doc["explanation"]
    assert any("estimated maximum model length is 19152" in e for e in doc["evidence"])
    assert doc["command_after"] == ["vllm", "serve", "meta-llama/Llama-3.1-8B", "--max-model-len=18432"]


def test_text_report_shows_before_and_after(tmp_path):
    bundle = write_bundle(tmp_path / "b", V1_MAXLEN, make_pod(command=["/bin/sh", "-c"],
                                                              args=["exec vllm serve m --max_model_len 32768 && echo bye"]))
    code, out, _ = run("diagnose", str(bundle))
    assert code == 0
    assert "Cause: kv-cache-max-model-len" in out
    assert "before: /bin/sh -c 'exec vllm serve m --max_model_len 32768 && echo bye'" in out
    assert "after:  /bin/sh -c 'exec vllm serve m --max_model_len 18432 && echo bye'" in out


def test_log_alone(tmp_path):
    log = tmp_path / "x.log"
    log.write_text(V1_MAXLEN)
    code, out, _ = run("diagnose", "--log", str(log), "--format", "json")
    assert code == 0
    assert json.loads(out)["changes"][0]["after"] == "18432"


@pytest.mark.parametrize("content, words", [
    (b"", "empty"),
    (b"\x00\x01\x02\xff" * 4096, "binary data"),
    (b"hello world\nthis is some other program\nall fine\n", "format this bot does not recognise"),
    (b"INFO 06-01 10:00:00 [api_server.py:1] vLLM API server version 0.11.0\nValueError: invalid literal for int() with base 10: 'MIG-74d6'\n",
     "not in a way any playbook recognises"),
], ids=["empty", "binary", "unknown-format", "unknown-error"])
def test_odd_logs_get_no_known_cause(tmp_path, content, words):
    bundle = write_bundle(tmp_path / "b", content)
    code, out, err = run("diagnose", str(bundle), "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["cause"] is None and doc["changes"] == []
    assert words in doc["explanation"]


@pytest.mark.parametrize("setup, words", [
    (lambda p: None, "no such bundle folder"),
    (lambda p: p.mkdir(), "no previous.log"),
    (lambda p: (p.mkdir(), (p / "previous.log").write_text("x"), (p / "pod.yaml").write_text("kind: Pod\nspec: [unclosed\n")),
     "pod.yaml: line"),
    (lambda p: (p.mkdir(), (p / "previous.log").write_text("x"), (p / "pod.yaml").write_text("kind: Node\n")),
     "expected a Pod object"),
], ids=["missing", "no-log", "bad-yaml", "wrong-kind"])
def test_unreadable_bundles_get_a_one_line_error(tmp_path, setup, words):
    bundle = tmp_path / "b"
    setup(bundle)
    code, out, err = run("diagnose", str(bundle))
    assert code == 2
    assert out == ""
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_broken_playbook_folder_is_a_clear_error(tmp_path):
    books = tmp_path / "books"
    books.mkdir()
    (books / "x.yaml").write_text("id: x\ntitle: t\n")
    bundle = write_bundle(tmp_path / "b", V1_MAXLEN)
    code, _, err = run("diagnose", str(bundle), "--playbooks", str(books))
    assert code == 2
    assert "x.yaml: field `summary`" in err


def test_eval_reports_cases_and_a_summary(tmp_path):
    case = write_bundle(tmp_path / "corpus" / "c1", V1_MAXLEN, make_pod(args=["--model", "m", "--max-model-len", "32768"]))
    (case / "expected.json").write_text(json.dumps({
        "cause": "kv-cache-max-model-len", "max_model_len_at_most": 19152,
        "levers": [{"kind": "flag", "name": "--max-model-len", "direction": "down"}]}))
    wrong = write_bundle(tmp_path / "corpus" / "c2", "ValueError: something else entirely\n")
    (wrong / "expected.json").write_text(json.dumps({"cause": "shm-too-small", "levers": []}))
    code, out, _ = run("eval", str(tmp_path / "corpus"))
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].startswith("ok  c1") and lines[1].startswith("BAD c2")
    assert lines[-1] == ("summary: 1/2 causes right, 1/1 proposals pull a labelled lever, 0 wrong confident fixes")
    assert run("eval", str(tmp_path / "corpus"), "--min-right", "2")[0] == 1



def test_eval_json_counts_per_era_and_accelerator(tmp_path):
    case = write_bundle(tmp_path / "corpus" / "c1", V1_MAXLEN, make_pod(args=["--model", "m", "--max-model-len", "32768"]))
    (case / "expected.json").write_text(json.dumps({
        "cause": "kv-cache-max-model-len", "vllm_version": "0.10.1.1", "accelerator": "nvidia",
        "levers": [{"kind": "flag", "name": "--max-model-len", "direction": "down"}]}))
    code, out, _ = run("eval", str(tmp_path / "corpus"), "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["cases"][0]["era"] == "0.7-0.10" and doc["cases"][0]["accelerator"] == "nvidia"
    assert doc["summary"]["by_era"] == {"0.7-0.10": {"cases": 1, "causes_right": 1, "right_change": 1,
                                                     "wrong_confident_fixes": 0}}
    assert list(doc["summary"]["by_accelerator"]) == ["nvidia"]


def test_eval_with_a_bad_label_is_one_line(tmp_path):
    case = write_bundle(tmp_path / "corpus" / "c1", V1_MAXLEN)
    (case / "expected.json").write_text(json.dumps({"cause": None, "accelerator": "h100"}))
    code, out, err = run("eval", str(tmp_path / "corpus"))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "c1/expected.json: field `accelerator`" in err and "Traceback" not in err

def test_playbooks_command_lists_causes():
    code, out, _ = run("playbooks")
    assert code == 0
    assert "shm-too-small" in out and "volume /dev/shm" in out
