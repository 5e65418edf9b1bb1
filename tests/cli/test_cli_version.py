"""The version (issue 19): `--version`, serve's start-up line, vllm_oncall_build_info in /metrics."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from builders import free_port, http
from test_cli_serve_process import env_for

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_version_flag_prints_the_package_version():
    out = subprocess.run([sys.executable, "-m", "bot.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout.strip()) == (0, f"vllm-oncall {VERSION}")


def test_serve_says_its_version_at_start_and_in_metrics(slack, tmp_path):
    port = free_port()
    env = {**os.environ, **env_for(slack, tmp_path, port)}
    proc = subprocess.Popen([sys.executable, "-m", "bot.cli", "serve"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        assert slack.wait_for(lambda: http(base + "/readyz")[0] == 200, 30), "never became ready"
        assert f'vllm_oncall_build_info{{version="{VERSION}"}} 1.0' in http(base + "/metrics")[1]
        proc.terminate()
        log, _ = proc.communicate(timeout=15)
        assert f"starting vllm-oncall {VERSION}: cluster serve-test" in log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
