"""The documented test alert stops at the bot (issue 19): it must not page anyone."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.builders import require

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def receivers_for(config: Path, *labels: str) -> list[str]:
    amtool = require("amtool")
    out = subprocess.run([amtool, "config", "routes", "test", f"--config.file={config}", *labels],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip().split(",")


def test_the_test_alert_reaches_only_the_bot_and_real_alerts_still_reach_your_pager(tmp_path):
    config = yaml.safe_load((DEPLOY / "alertmanager-receiver-example.yaml").read_text())
    # A user's usual receiver after the bot's routes: it catches everything that continues.
    config["route"]["routes"].append({"receiver": "pager"})
    config["receivers"].append({"name": "pager"})
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    test_alert = ("alertname=KubePodCrashLooping", "vllm_oncall_test=true", "namespace=ns", "pod=p")
    assert receivers_for(path, *test_alert) == ["vllm-oncall"]
    assert receivers_for(path, "alertname=KubePodCrashLooping", "namespace=ns", "pod=p") == ["vllm-oncall", "pager"]
