"""VLLM_ONCALL_APPROVER_SCOPES and VLLM_ONCALL_WHY_SCOPE: parsed from the environment or the
config file, with safe defaults, and a bad value is one line naming the variable."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from bot.cli.settings import SettingsError, load_settings

BASE = {"VLLM_ONCALL_CLUSTER": "prod-eu", "SLACK_BOT_TOKEN": "xoxb-1-2-abc", "SLACK_SIGNING_SECRET": "s",
        "VLLM_ONCALL_SLACK_CHANNEL": "C0ALERTS", "VLLM_ONCALL_ALERT_TOKEN": "alert-tok"}


def test_defaults_are_the_safe_ones():
    s = load_settings({**BASE, "VLLM_ONCALL_APPROVERS": "U0AAA"})
    assert s.why_scope == "channel" and s.approver_scopes == {} and s.approver_users == ["U0AAA"]


def test_scopes_from_the_environment_are_enough_to_approve():
    s = load_settings({**BASE, "VLLM_ONCALL_APPROVER_SCOPES": "ml-*=U0ML,S0ML,@C0ML; prod=U0PROD",
                       "VLLM_ONCALL_WHY_SCOPE": "open"})
    assert s.approver_scopes == {"ml-*": ["S0ML", "U0ML", "@C0ML"], "prod": ["U0PROD"]}
    assert s.why_scope == "open"


def test_scopes_as_a_mapping_in_the_config_file(tmp_path):
    f = tmp_path / "config.yaml"
    f.write_text(yaml.safe_dump({"approver_scopes": {"ml-*": ["U0ML", "@C0ML"], "prod": "U0PROD"}}))
    s = load_settings(BASE, f)
    assert s.approver_scopes == {"ml-*": ["U0ML", "@C0ML"], "prod": ["U0PROD"]}


@pytest.mark.parametrize("value,says", [
    ("ml-*", "expected NAMESPACE-GLOB=U1,S2,@C3"),
    ("ml-*=U0ML,X1", "X1 is not a user"),
    ("ml-*=@C0ML", "names no approver"),
])
def test_a_bad_scope_is_named(value, says):
    with pytest.raises(SettingsError, match="VLLM_ONCALL_APPROVER_SCOPES") as err:
        load_settings({**BASE, "VLLM_ONCALL_APPROVERS": "U0AAA", "VLLM_ONCALL_APPROVER_SCOPES": value})
    assert says in str(err.value) and len(str(err.value).splitlines()) == 1


def test_serve_check_says_a_bad_scope_in_one_line():
    env = {"PATH": "/usr/bin", **BASE, "VLLM_ONCALL_APPROVER_SCOPES": "prod=U0PROD;ml-*=nobody"}
    result = subprocess.run([sys.executable, "-m", "bot.cli", "serve", "--check", "--offline"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "VLLM_ONCALL_APPROVER_SCOPES: ml-*: nobody is not a user" in result.stderr
