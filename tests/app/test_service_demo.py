"""`vllm-oncall demo`: the README's first command runs the whole pipeline on the bundled incident."""

from __future__ import annotations

import contextlib
import io

import yaml

from bot.cli import main


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["demo", *argv])
    return code, out.getvalue()


def test_demo_prints_the_message_that_would_be_posted(tmp_path):
    code, text = run("--state-dir", str(tmp_path))
    assert code == 0
    for expected in ("Message posted to #vllm-oncall", "demo-cluster", "inference/vllm-llama3-8b",
                     "vllm-llama3-8b-7d9f8c6b5-x2k4p / vllm", "gpu-l4-node-3", "NVIDIA-L4", "Restarts:          7",
                     "kv-cache-max-model-len", "Available KV cache memory: 2.34 GiB",
                     "--max-model-len 32768", "--max-model-len 18432", "[Approve]", "[Reject]",
                     "the bot answered 200"):
        assert expected in text, expected
    assert text.count("Message posted to") == 1
    assert list((tmp_path / "incidents").glob("*.json"))


def test_demo_approve_writes_the_change(tmp_path):
    code, text = run("--approve", "--state-dir", str(tmp_path))
    assert code == 0
    assert "Applied by <@U0DEMOAPPROVER>" in text and "[Roll back]" in text
    manifest = next((tmp_path / "cluster").glob("deployment-*.yaml"))
    args = yaml.safe_load(manifest.read_text())["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-model-len") + 1] == "18432"


def test_demo_a_second_run_on_the_same_state_posts_nothing_new(tmp_path):
    run("--state-dir", str(tmp_path))
    code, text = run("--state-dir", str(tmp_path))
    assert code == 0 and "Message posted to" not in text and "updated in place" in text
