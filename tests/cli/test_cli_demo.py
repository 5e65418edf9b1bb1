"""`vllm-oncall demo --approve`: shows the patched manifest as a diff without the fields the API
server sets, and leaves no temporary folder behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def demo(tmp: Path, *argv: str) -> subprocess.CompletedProcess:
    # TMPDIR: the demo's temporary folder goes here, so the test can see it is gone afterwards.
    return subprocess.run([sys.executable, "-m", "bot.cli", "demo", *argv], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "TMPDIR": str(tmp)})


def test_demo_approve_prints_the_diff_of_the_patched_manifest_and_cleans_up(tmp_path):
    result = demo(tmp_path, "--approve")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    diff = out[out.index("The patched manifest (deployment.yaml"):]
    assert "--- a/deployment.yaml\n+++ b/deployment.yaml\n" in diff
    assert "-        - '32768'\n+        - '18432'\n" in diff
    assert "+    vllm-oncall.io/last-change:" in diff  # the audit annotation the change adds
    for server_set in ("uid:", "resourceVersion:", "status:", "generation:"):
        assert server_set not in diff, server_set
    assert "Temporary state removed" in out
    assert list(tmp_path.iterdir()) == []


def test_demo_without_approve_leaves_nothing_either(tmp_path):
    result = demo(tmp_path)
    assert result.returncode == 0 and "[Approve]" in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_demo_state_dir_is_kept(tmp_path):
    state = tmp_path / "state"
    result = demo(tmp_path, "--approve", "--state-dir", str(state))
    assert result.returncode == 0 and f"State kept in {state}" in result.stdout
    assert list((state / "cluster").glob("deployment-*.yaml"))
