"""`vllm-oncall serve` configuration: every problem named by its variable, `--check` validates only."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bot.cli.settings import SettingsError, load_settings

GOOD = {"VLLM_ONCALL_CLUSTER": "prod-eu", "SLACK_BOT_TOKEN": "xoxb-1-2-abc", "SLACK_SIGNING_SECRET": "s",
        "VLLM_ONCALL_SLACK_CHANNEL": "C0ALERTS", "VLLM_ONCALL_APPROVERS": "U0AAA, U0BBB"}


def test_good_environment():
    s = load_settings(GOOD)
    assert s.cluster_name == "prod-eu" and s.approver_users == ["U0AAA", "U0BBB"]
    assert s.alertnames == ["KubePodCrashLooping"] and s.proposal_ttl_seconds == 3600
    assert s.host_port == ("0.0.0.0", 8080)


def test_every_problem_is_named_at_once():
    env = {"SLACK_BOT_TOKEN": "xoxp-user-token", "VLLM_ONCALL_PROPOSAL_TTL_SECONDS": "soon",
           "VLLM_ONCALL_APPROVERS": "alice", "VLLM_ONCALL_LISTEN": "localhost"}
    with pytest.raises(SettingsError) as err:
        load_settings(env)
    text = str(err.value)
    for expected in ("VLLM_ONCALL_CLUSTER: required, not set", "VLLM_ONCALL_SLACK_CHANNEL: required, not set",
                     "SLACK_BOT_TOKEN: must be a bot token starting with xoxb-",
                     "VLLM_ONCALL_PROPOSAL_TTL_SECONDS:", "VLLM_ONCALL_APPROVERS: Slack user ids start with U",
                     "VLLM_ONCALL_LISTEN: must be HOST:PORT"):
        assert expected in text, expected
    assert "xoxp-user-token" not in text  # secrets are never echoed


def test_combinations():
    env = {k: v for k, v in GOOD.items() if k not in ("SLACK_SIGNING_SECRET", "VLLM_ONCALL_APPROVERS")}
    with pytest.raises(SettingsError) as err:
        load_settings(env)
    assert "SLACK_SIGNING_SECRET: required when SLACK_APP_TOKEN is not set" in str(err.value)
    assert "set at least one approver" in str(err.value)
    assert load_settings({**env, "SLACK_APP_TOKEN": "xapp-1", "VLLM_ONCALL_APPROVER_GROUPS": "S0ONCALL"})


def test_file_then_environment(tmp_path):
    f = tmp_path / "oncall.yaml"
    f.write_text("cluster_name: from-file\nworkers: 8\napprover_groups: [S0ONCALL]\nalertnames: [A, B]\n")
    s = load_settings({k: v for k, v in GOOD.items() if k != "VLLM_ONCALL_CLUSTER"}, f)
    assert s.cluster_name == "from-file" and s.workers == 8 and s.alertnames == ["A", "B"]
    assert load_settings(GOOD, f).cluster_name == "prod-eu"  # the environment wins
    f.write_text("cluster_nmae: typo\n")
    with pytest.raises(SettingsError, match="unknown setting 'cluster_nmae'"):
        load_settings(GOOD, f)


def run_check(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bot.cli", "serve", "--check"], env={"PATH": "/usr/bin", **env},
                          capture_output=True, text=True, timeout=60)


def test_serve_check_ok_and_failing():
    ok = run_check(GOOD)
    assert ok.returncode == 0 and "configuration OK: cluster prod-eu" in ok.stdout
    bad = run_check({"SLACK_BOT_TOKEN": "xoxb-1"})
    assert bad.returncode == 2 and "VLLM_ONCALL_CLUSTER: required, not set" in bad.stderr
