"""Settings that `serve --check` used to accept (issue 19): each refused, naming its variable."""

from __future__ import annotations

import pytest

from bot.cli.settings import SettingsError, load_settings

GOOD = {"VLLM_ONCALL_CLUSTER": "prod-eu", "SLACK_BOT_TOKEN": "xoxb-1-2-abc", "SLACK_SIGNING_SECRET": "s",
        "VLLM_ONCALL_SLACK_CHANNEL": "C0ALERTS", "VLLM_ONCALL_APPROVERS": "U0AAA"}


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("VLLM_ONCALL_LLM_BASE_URL", "not a url", "must be an http:// or https:// URL"),
    ("VLLM_ONCALL_PROMETHEUS_URL", "prometheus:9090", "must be an http:// or https:// URL"),
    ("VLLM_ONCALL_ALERTNAMES", " , ", "name at least one alert"),
])
def test_a_bad_value_is_refused_naming_its_variable(variable, value, says):
    with pytest.raises(SettingsError) as info:
        load_settings({**GOOD, variable: value})
    assert variable in str(info.value) and says in str(info.value) and "\n" not in str(info.value)


def test_a_missing_bundle_directory_is_refused(tmp_path):
    env = {**GOOD, "VLLM_ONCALL_CLUSTER_SOURCE": "local", "VLLM_ONCALL_BUNDLE_DIR": str(tmp_path / "nowhere")}
    with pytest.raises(SettingsError, match=r"VLLM_ONCALL_BUNDLE_DIR: .*nowhere is not a folder"):
        load_settings(env)


def test_good_urls_pass():
    s = load_settings({**GOOD, "VLLM_ONCALL_PROMETHEUS_URL": "http://prometheus:9090",
                       "VLLM_ONCALL_LLM_BASE_URL": "https://llm.example/v1"})
    assert s.verify.prometheus_url == "http://prometheus:9090" and s.llm.base_url == "https://llm.example/v1"
