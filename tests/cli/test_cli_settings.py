"""`vllm-oncall serve` configuration: every problem named by its variable, `--check` validates only."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bot.cli.settings import SettingsError, load_settings
from bot.diagnosis.playbooks import DEFAULT_DIR

GOOD = {"VLLM_ONCALL_CLUSTER": "prod-eu", "SLACK_BOT_TOKEN": "xoxb-1-2-abc", "SLACK_SIGNING_SECRET": "s",
        "VLLM_ONCALL_SLACK_CHANNEL": "C0ALERTS", "VLLM_ONCALL_APPROVERS": "U0AAA, U0BBB",
        "VLLM_ONCALL_ALERT_TOKEN": "alert-tok"}


def test_good_environment():
    s = load_settings(GOOD)
    assert s.cluster_name == "prod-eu" and s.approver_users == ["U0AAA", "U0BBB"]
    assert s.http.alertnames == ["KubePodCrashLooping"] and s.proposal_ttl_seconds == 3600
    assert s.http.host_port == ("0.0.0.0", 8080)


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
    assert s.cluster_name == "from-file" and s.http.workers == 8 and s.http.alertnames == ["A", "B"]
    assert load_settings(GOOD, f).cluster_name == "prod-eu"  # the environment wins
    f.write_text("cluster_nmae: typo\n")
    with pytest.raises(SettingsError, match="unknown setting 'cluster_nmae'"):
        load_settings(GOOD, f)


def run_check(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bot.cli", "serve", "--check", "--offline", *args],
                          env={"PATH": "/usr/bin", **env}, capture_output=True, text=True, timeout=60)


def write_kubeconfig(path: Path, server: str) -> str:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
        "clusters": [{"name": "stand-in", "cluster": {"server": server}}],
        "users": [{"name": "bot", "user": {"token": "not-a-secret"}}],
        "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "bot"}}]}))
    return str(path)


def test_serve_check_ok_and_failing(kube_api, tmp_path):
    ok = run_check({**GOOD, "KUBECONFIG": write_kubeconfig(tmp_path / "kubeconfig", kube_api.url)})
    assert ok.returncode == 0 and "configuration OK: cluster prod-eu" in ok.stdout
    assert "playbooks OK: " in ok.stdout and "kubernetes OK" in ok.stdout
    bad = run_check({"SLACK_BOT_TOKEN": "xoxb-1"})
    assert bad.returncode == 2 and "VLLM_ONCALL_CLUSTER: required, not set" in bad.stderr


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result.stderr


def test_serve_check_without_a_cluster_says_so_in_one_line(tmp_path):
    err = one_line_error(run_check({**GOOD, "KUBECONFIG": str(tmp_path / "none")}))
    assert "no Kubernetes access: not running in a pod" in err


def test_serve_check_with_an_unreachable_server_says_so_in_one_line(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err = one_line_error(run_check({**GOOD, "KUBECONFIG": write_kubeconfig(tmp_path / "k", f"https://127.0.0.1:{port}")}))
    assert f"cannot reach the Kubernetes API server at https://127.0.0.1:{port}" in err


def test_serve_check_loads_extra_playbooks_and_fails_on_a_typo(kube_api, tmp_path):
    env = {**GOOD, "KUBECONFIG": write_kubeconfig(tmp_path / "kubeconfig", kube_api.url)}
    books = tmp_path / "books"
    books.mkdir()
    shutil.copy(DEFAULT_DIR / "shm-too-small.yaml", books)
    ok = run_check({**env, "VLLM_ONCALL_PLAYBOOKS": str(books)})
    assert ok.returncode == 0 and f"playbooks OK: {len(list(DEFAULT_DIR.glob('*.yaml')))} ({books})" in ok.stdout
    (books / "shm-too-small.yaml").write_text((books / "shm-too-small.yaml").read_text().replace("title:", "titel:"))
    typo = run_check(env, "--playbooks", str(books))  # one line per problem found in the file
    assert typo.returncode == 2 and "Traceback" not in typo.stderr
    assert "shm-too-small.yaml: field `titel`: unknown field" in typo.stderr
    assert "no playbooks folder" in one_line_error(run_check({**env, "VLLM_ONCALL_PLAYBOOKS": str(tmp_path / "typo")}))


def test_config_keys_are_the_variables_in_lower_case_or_the_setting_names(tmp_path):
    f = tmp_path / "oncall.yaml"
    f.write_text("vllm_oncall_cluster: from-file\nslack_bot_token: xoxb-1\nslack_signing_secret: s\n"
                 "VLLM_ONCALL_SLACK_CHANNEL: C0ALERTS\napprover_users: [U0A]\nvllm_oncall_playbooks: [/a, /b]\n")
    s = load_settings({}, f)
    assert s.cluster_name == "from-file" and s.slack.channel == "C0ALERTS" and s.playbooks == [Path("/a"), Path("/b")]
    f.write_text(f.read_text() + "cluster_name: twice\n")
    with pytest.raises(SettingsError, match="'cluster_name' sets cluster_name a second time"):
        load_settings({}, f)


def test_proposals_only_mode_needs_no_approver_and_approve_mode_does():
    env = {k: v for k, v in GOOD.items() if k != "VLLM_ONCALL_APPROVERS"}
    assert load_settings({**env, "VLLM_ONCALL_MODE": "proposals-only"}).mode == "proposals-only"
    with pytest.raises(SettingsError, match="set at least one approver"):
        load_settings({**env, "VLLM_ONCALL_MODE": "approve"})
    with pytest.raises(SettingsError, match="VLLM_ONCALL_MODE: Input should be 'proposals-only' or 'approve'"):
        load_settings({**GOOD, "VLLM_ONCALL_MODE": "yolo"})


def test_serve_check_names_a_missing_permission_in_one_line(kube_api, tmp_path):
    kube_api.fail("list", "vllmincidents", 403)
    err = one_line_error(run_check({**GOOD, "KUBECONFIG": write_kubeconfig(tmp_path / "kubeconfig", kube_api.url)}))
    assert "the Kubernetes API refused the first calls" in err and "may not list vllmincidents" in err


@pytest.mark.parametrize("channel", ["#alerts", "alerts", "c0alerts", "C"])
def test_the_alert_channel_must_be_an_id_the_history_can_be_read_by(channel):
    with pytest.raises(SettingsError) as err:
        load_settings({**GOOD, "VLLM_ONCALL_SLACK_CHANNEL": channel})
    assert str(err.value).startswith("invalid configuration: VLLM_ONCALL_SLACK_CHANNEL: must be the channel's ID")
    assert load_settings({**GOOD, "VLLM_ONCALL_SLACK_CHANNEL": "G0PRIVATE"}).slack.channel == "G0PRIVATE"


def test_the_socket_mode_ping_interval_is_a_positive_number_of_seconds():
    assert load_settings(GOOD).slack.ping_seconds == 10  # Bolt's own default
    assert load_settings({**GOOD, "VLLM_ONCALL_SLACK_PING_SECONDS": "2.5"}).slack.ping_seconds == 2.5
    for bad in ("0", "often", "600"):
        with pytest.raises(SettingsError) as err:
            load_settings({**GOOD, "VLLM_ONCALL_SLACK_PING_SECONDS": bad})
        assert str(err.value).count("\n") == 0 and "VLLM_ONCALL_SLACK_PING_SECONDS:" in str(err.value), bad


def test_the_recovery_time_outs_default_to_what_they_were_and_reach_the_wiring(slack, tmp_path):
    from bot.cli.wiring import build_server

    s = load_settings(GOOD)
    assert (s.post_lease_seconds, s.apply_grace_seconds, s.slack.timeout_seconds) == (60, 120, 10)
    env = {**GOOD, "SLACK_API_URL": slack.url, "VLLM_ONCALL_LISTEN": "127.0.0.1:0", "VLLM_ONCALL_STORE": "folder",
           "VLLM_ONCALL_STATE_DIR": str(tmp_path), "VLLM_ONCALL_CLUSTER_SOURCE": "local",
           "VLLM_ONCALL_SWEEP_INTERVAL_SECONDS": "2",  # renews verify leases well inside the shortest grace here
           "VLLM_ONCALL_BUNDLE_DIR": str(Path(__file__).resolve().parents[2] / "examples" / "incident" / "bundle")}
    for lease, grace, timeout, budget in ((None, None, None, 30.0), ("7", "9", "3", 3.5)):
        given = {"VLLM_ONCALL_POST_LEASE_SECONDS": lease, "VLLM_ONCALL_APPLY_GRACE_SECONDS": grace,
                 "VLLM_ONCALL_SLACK_TIMEOUT_SECONDS": timeout}
        server, _ = build_server(load_settings({**env, **{k: v for k, v in given.items() if v}}))
        try:
            service = server.router.default
            chat = service.chat
            assert chat.client.timeout == int(timeout or 10)
            # paced (bot.app.pacing): half of it to wait for the channel's turn, half for the retries
            assert chat.post_wait + chat.post_retries.budget == budget, "a post gets half the lease"
            assert budget + chat.client.timeout < float(lease or 60), "and end inside it"
            assert service.policy.post_lease.total_seconds() == float(lease or 60)
            assert service.policy.apply_grace.total_seconds() == float(grace or 120)
            assert service.policy.patch_seconds is None  # a local cluster: no Kubernetes patch to bound
        finally:
            server.stop()


def test_a_slack_timeout_that_leaves_no_room_in_the_post_lease_is_one_clear_line():
    with pytest.raises(SettingsError) as err:
        load_settings({**GOOD, "VLLM_ONCALL_POST_LEASE_SECONDS": "15", "VLLM_ONCALL_SLACK_TIMEOUT_SECONDS": "10"})
    assert str(err.value).count("\n") == 0
    assert "VLLM_ONCALL_POST_LEASE_SECONDS (15) must be more than twice VLLM_ONCALL_SLACK_TIMEOUT_SECONDS (10)" \
        in str(err.value)
    for var, bad in (("VLLM_ONCALL_APPLY_GRACE_SECONDS", "1"), ("VLLM_ONCALL_POST_LEASE_SECONDS", "0"),
                     ("VLLM_ONCALL_SLACK_TIMEOUT_SECONDS", "0.5")):
        with pytest.raises(SettingsError) as err:
            load_settings({**GOOD, var: bad})
        assert str(err.value).startswith(f"invalid configuration: {var}:"), str(err.value)


def test_a_sweep_too_slow_to_renew_a_verify_lease_inside_the_grace_is_one_clear_line():
    with pytest.raises(SettingsError) as err:
        load_settings({**GOOD, "VLLM_ONCALL_SWEEP_INTERVAL_SECONDS": "60", "VLLM_ONCALL_APPLY_GRACE_SECONDS": "100"})
    assert str(err.value).count("\n") == 0
    assert "VLLM_ONCALL_SWEEP_INTERVAL_SECONDS (60) must be less than half VLLM_ONCALL_APPLY_GRACE_SECONDS (100)" \
        in str(err.value)
    load_settings({**GOOD, "VLLM_ONCALL_SWEEP_INTERVAL_SECONDS": "49", "VLLM_ONCALL_APPLY_GRACE_SECONDS": "100"})


def test_a_kubernetes_patch_ends_within_half_the_apply_grace(kube_api):
    from bot.kube.api import KubeApi, patch_bounds

    assert patch_bounds(60) == (30, 30)  # the default grace, 120 s: 30 s per attempt, retries for 30 s
    assert patch_bounds(4) == (2, 2) and patch_bounds(400) == (30, 200)  # never longer per attempt than 30 s
    api = KubeApi(kube_api.api_client(), patch_within=4)
    assert (api.patch_timeout, api.patch_retry.budget) == (2, 2)
    assert api.retry.budget is None and api.request_timeout == 30  # the other calls are as they were


def test_the_llm_settings_are_read_with_the_others_and_a_bad_one_is_one_line_naming_its_variable():
    assert load_settings(GOOD).llm.endpoint() is None  # nothing is sent unless a base URL is set
    llm = load_settings({**GOOD, "VLLM_ONCALL_LLM_BASE_URL": "http://llm:8000/v1", "VLLM_ONCALL_LLM_MODEL": "m",
                         "VLLM_ONCALL_LLM_TIMEOUT_SECONDS": "2.5", "VLLM_ONCALL_LLM_API_KEY": "sk-secret"}).llm.endpoint()
    assert llm is not None and (llm.base_url, llm.model, llm.timeout_seconds) == ("http://llm:8000/v1", "m", 2.5)
    with pytest.raises(SettingsError) as err:
        load_settings({**GOOD, "VLLM_ONCALL_LLM_BASE_URL": "http://llm:8000/v1",
                       "VLLM_ONCALL_LLM_TIMEOUT_SECONDS": "soon"})
    assert str(err.value).startswith("invalid configuration: VLLM_ONCALL_LLM_TIMEOUT_SECONDS:")
    assert "\n" not in str(err.value)


def test_the_chat_pace_is_slacks_rate_unless_set_and_zero_is_unpaced(slack, tmp_path):
    from bot.cli.wiring import build_server

    assert (load_settings(GOOD).slack.pace.post_interval, load_settings(GOOD).slack.pace.update_interval) == (1.0, 1.2)
    env = {**GOOD, "SLACK_API_URL": slack.url, "VLLM_ONCALL_LISTEN": "127.0.0.1:0", "VLLM_ONCALL_STORE": "folder",
           "VLLM_ONCALL_STATE_DIR": str(tmp_path), "VLLM_ONCALL_CLUSTER_SOURCE": "local",
           "VLLM_ONCALL_BUNDLE_DIR": str(Path(__file__).resolve().parents[2] / "examples" / "incident" / "bundle"),
           "VLLM_ONCALL_SLACK_POST_INTERVAL": "0", "VLLM_ONCALL_SLACK_UPDATE_INTERVAL": "2.5"}
    server, _ = build_server(load_settings(env))
    try:
        pacer = server.router.default.chat.pacer
        assert (pacer.rules.post_interval, pacer.rules.update_interval) == (0, 2.5)
    finally:
        server.stop()
    with pytest.raises(SettingsError) as err:
        load_settings({**GOOD, "VLLM_ONCALL_SLACK_POST_INTERVAL": "-1"})
    assert str(err.value).count("\n") == 0
    assert str(err.value).startswith("invalid configuration: VLLM_ONCALL_SLACK_POST_INTERVAL:"), str(err.value)
