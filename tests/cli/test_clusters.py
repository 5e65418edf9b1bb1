"""One bot process serving two clusters (VLLM_ONCALL_CLUSTERS), wired by build_server from settings:
two Kubernetes API stand-ins reached through one kubeconfig with two contexts, the real kubernetes
client, the Slack stand-in, and the real Bolt pipeline over the bot's own HTTP server (signed
requests). Both clusters run the same Deployment in the same namespace, so a request routed to the
wrong cluster would find a workload there to diagnose or patch: every test checks the other one
was left alone."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from builders import EXAMPLE_LOG, http, kubeconfig_with
from kubeapi.objects import container, crashing_deployment
from slackapi.requests import button_value, click_body, command_body, signed_headers

from bot.cli.settings import load_settings
from bot.cli.wiring import build_server

SECRET = "two-clusters-secret"
NS, DEPLOY, APPROVER, CHANNEL = "inference", "vllm", "U0APPROVER", "C0ALERTS"
ARGS = ["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"]



class TwoClusters:
    """alpha (the default) and beta, each with its own stand-in, served by one build_server."""

    def __init__(self, kube_a, kube_b, slack, tmp_path, monkeypatch, wait_ready: bool = True, **extra_env: str):
        self.kube = {"alpha": kube_a, "beta": kube_b}
        self.slack = slack
        self.pods = {}
        for name, kube in self.kube.items():
            _, pod = crashing_deployment(kube, name=DEPLOY, previous_log=EXAMPLE_LOG, containers=[container(
                command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"], args=list(ARGS))])
            self.pods[name] = pod["metadata"]["name"]
        kubeconfig = kubeconfig_with({"ctx-a": kube_a.url, "ctx-b": kube_b.url}, tmp_path / "kubeconfig")
        monkeypatch.setenv("KUBECONFIG", kubeconfig)  # what the kubernetes client reads
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        self.env = {"VLLM_ONCALL_CLUSTERS": "alpha=ctx-a,beta=ctx-b", "KUBECONFIG": kubeconfig,
                    "SLACK_BOT_TOKEN": "xoxb-clusters", "SLACK_SIGNING_SECRET": SECRET, "SLACK_API_URL": slack.url,
                    "VLLM_ONCALL_SLACK_CHANNEL": CHANNEL, "VLLM_ONCALL_APPROVERS": APPROVER,
                    "VLLM_ONCALL_ALERTS_UNAUTHENTICATED": "true", "VLLM_ONCALL_LISTEN": "127.0.0.1:0", "VLLM_ONCALL_STORE": "kube",
                    "VLLM_ONCALL_INCIDENT_NAMESPACE": "vllm-oncall", "VLLM_ONCALL_VERIFY_TIMEOUT_SECONDS": "1",
                    "VLLM_ONCALL_VERIFY_SOAK_SECONDS": "0", "VLLM_ONCALL_SWEEP_INTERVAL_SECONDS": "3600",
                    "VLLM_ONCALL_APPLY_GRACE_SECONDS": "7201",  # no sweep during a test: the test sweeps itself
                    "VLLM_ONCALL_SLACK_MAX_ATTEMPTS": "2", **extra_env}
        self.server, _ = build_server(load_settings(self.env))
        self.server.start()
        if wait_ready:
            assert slack.wait_for(lambda: http(self.server.url + "/readyz")[0] == 200, 30), "never became ready"

    def stop(self) -> None:
        self.server.stop()

    # ---- what goes in -------------------------------------------------------------------

    def alerts(self, *clusters: str | None) -> dict:
        """One webhook with a KubePodCrashLooping alert per entry (its `cluster` label; None: none)."""
        alerts = []
        for cluster in clusters:
            pod = self.pods.get(cluster or "alpha", self.pods["alpha"])
            labels = {"alertname": "KubePodCrashLooping", "namespace": NS, "pod": pod, "container": "vllm",
                      **({"cluster": cluster} if cluster else {})}
            alerts.append({"status": "firing", "labels": labels, "annotations": {}})
        body = json.dumps({"version": "4", "status": "firing", "receiver": "vllm-oncall", "alerts": alerts})
        status, answer = http(self.server.url + "/alerts", body.encode(), {"Content-Type": "application/json"})
        assert status == 200, answer
        return json.loads(answer)

    def slack_request(self, body: str) -> str:
        headers = {k: v[0] for k, v in signed_headers(body, SECRET).items()}
        status, answer = http(self.server.url + "/slack/events", body.encode(), headers)
        assert status == 200, answer
        return answer

    def click(self, value: str, ts: str, message_text: str = "incident") -> None:
        body = click_body("vllm_approve", value, APPROVER, ts, channel=CHANNEL)
        if message_text != "incident":  # what Slack sends: the clicked message's fallback text
            payload = json.loads(urllib.parse.parse_qs(body)["payload"][0])
            payload["message"]["text"] = message_text
            body = urllib.parse.urlencode({"payload": json.dumps(payload)})
        before = len(self.answers())
        self.slack_request(body)
        assert self.slack.wait_for(lambda: len(self.answers()) > before, 20), "the click was never answered"

    def answers(self) -> list:
        """What the bot said in Slack (Bolt's own auth.test is not an answer)."""
        return [c for c in self.slack.calls if c.method != "auth.test"]

    # ---- what came out ------------------------------------------------------------------

    def incidents(self, cluster: str) -> list[dict]:
        return self.kube[cluster].list("VLLMIncident", "vllm-oncall")

    def patches(self, cluster: str) -> list:
        return [c for c in self.kube[cluster].calls if c.verb == "patch" and not c.dry_run
                and c.resource in ("deployments", "statefulsets")]

    def args(self, cluster: str) -> list[str]:
        return self.kube[cluster].get("Deployment", DEPLOY, NS)["spec"]["template"]["spec"]["containers"][0]["args"]

    def posted_in(self, cluster: str):
        return [p for p in self.slack.posts() if p.params.get("text", "").startswith(f"[{cluster}] ")]

    def told(self) -> list[str]:
        return [c.params["text"] for c in self.slack.delivered("chat.postEphemeral")]

    def metrics(self) -> str:
        return http(self.server.url + "/metrics")[1]


@pytest.fixture
def clusters(kube_api, kube_api_b, slack, tmp_path, monkeypatch):
    world = TwoClusters(kube_api, kube_api_b, slack, tmp_path, monkeypatch)
    try:
        yield world
    finally:
        world.stop()


@pytest.mark.parametrize("label, served", [("beta", "beta"), ("alpha", "alpha"), (None, "alpha")],
                         ids=["labelled-beta", "labelled-alpha", "unlabelled-goes-to-the-default"])
def test_an_alert_opens_the_incident_in_its_cluster_and_approve_patches_that_cluster_only(clusters, label, served):
    other = "alpha" if served == "beta" else "beta"
    answer = clusters.alerts(label)
    assert answer["accepted"] == 1 and answer["skipped"] == []
    assert clusters.slack.wait_for(lambda: len(clusters.posted_in(served)) == 1, 30), "the incident was not posted"
    # stored in its own cluster, in no other
    assert len(clusters.incidents(served)) == 1 and clusters.incidents(other) == []
    post = clusters.posted_in(served)[0]
    value = button_value(post, "vllm_approve")
    assert value and value.startswith(f"{served}-inference-vllm-")
    clusters.click(value, _ts(clusters, post))
    assert clusters.slack.wait_for(lambda: len(clusters.patches(served)) == 1, 20), "the approved patch never came"
    assert clusters.args(served) != ARGS and clusters.patches(other) == [] and clusters.args(other) == ARGS


def test_each_cluster_approves_its_own_incident_when_both_have_one(clusters):
    clusters.alerts("alpha", "beta")
    assert clusters.slack.wait_for(lambda: len(clusters.slack.posts()) == 2, 30)
    names = {c: clusters.incidents(c)[0]["metadata"]["name"] for c in ("alpha", "beta")}
    assert names["alpha"] != names["beta"]  # the same workload and cause: the name hashes the cluster
    beta_post = clusters.posted_in("beta")[0]
    clusters.click(button_value(beta_post, "vllm_approve"), _ts(clusters, beta_post))
    assert clusters.slack.wait_for(lambda: len(clusters.patches("beta")) == 1, 20)
    assert clusters.patches("alpha") == [] and clusters.args("alpha") == ARGS
    assert clusters.incidents("alpha")[0]["spec"]["state"] == "proposed"  # alpha's proposal still waits
    alpha_post = clusters.posted_in("alpha")[0]
    clusters.click(button_value(alpha_post, "vllm_approve"), _ts(clusters, alpha_post))
    assert clusters.slack.wait_for(lambda: len(clusters.patches("alpha")) == 1, 20)
    assert len(clusters.patches("beta")) == 1  # beta was patched once, by its own click


def _ts(clusters: TwoClusters, post) -> str:
    """The ts Slack gave the posted message (the stand-in answers it; the bot stored it on the incident)."""
    cluster = post.params["text"][1:].partition("]")[0]
    record = json.loads(clusters.incidents(cluster)[0]["spec"]["record"])
    return record["slack_ts"]


def test_an_alert_for_a_cluster_not_served_is_skipped_counted_and_the_rest_of_the_webhook_still_handled(clusters):
    answer = clusters.alerts("gamma", "beta")
    assert answer["accepted"] == 1
    assert answer["skipped"] == [{"index": 0, "reason": "unknown cluster: gamma"}]
    assert clusters.slack.wait_for(lambda: len(clusters.posted_in("beta")) == 1, 30)
    assert 'vllm_oncall_alerts_skipped_total{reason="unknown cluster"} 1.0' in clusters.metrics()
    assert clusters.incidents("alpha") == [] and len(clusters.slack.posts()) == 1


def test_why_with_a_cluster_prefix_diagnoses_in_that_cluster(clusters):
    alpha_calls = len(clusters.kube["alpha"].calls)
    answer = clusters.slack_request(command_body(f"why beta:{NS}/{DEPLOY}", APPROVER, CHANNEL))
    assert "in cluster beta" in answer
    assert clusters.slack.wait_for(lambda: len(clusters.posted_in("beta")) == 1, 30), "no diagnosis was posted"
    assert any(c.resource == "pods/log" for c in clusters.kube["beta"].calls)
    assert not any(c.resource == "pods/log" for c in clusters.kube["alpha"].calls[alpha_calls:])
    assert clusters.posted_in("alpha") == []


def test_why_without_a_prefix_looks_in_the_default_cluster(clusters):
    answer = clusters.slack_request(command_body(f"why {NS}/{DEPLOY}", APPROVER, CHANNEL))
    assert "in cluster alpha" in answer
    assert clusters.slack.wait_for(lambda: len(clusters.posted_in("alpha")) == 1, 30)
    assert not any(c.resource == "pods/log" for c in clusters.kube["beta"].calls)


def test_why_for_a_cluster_not_served_says_so_in_one_line_and_asks_no_cluster(clusters):
    before = {c: len(k.calls) for c, k in clusters.kube.items()}
    answer = clusters.slack_request(command_body(f"why gamma:{NS}/{DEPLOY}", APPROVER, CHANNEL))
    text = json.loads(answer)["text"] if answer.startswith("{") else answer
    assert "this bot does not serve cluster `gamma`; it serves `alpha`, `beta`" in text
    assert "\n" not in text and "Nothing was done" in text
    time.sleep(0.3)
    assert {c: len(k.calls) for c, k in clusters.kube.items()} == before and clusters.slack.posts() == []


def test_help_lists_the_served_clusters(clusters):
    answer = clusters.slack_request(command_body("help", APPROVER, CHANNEL))
    assert "clusters alpha, beta; default alpha" in answer and "CLUSTER:NAMESPACE/POD" in answer


def test_a_click_for_an_incident_no_served_cluster_holds_is_refused_and_changes_nothing(clusters):
    clusters.click("alpha-inference-vllm-gone-0123abcd|" + "0" * 64, "1700000000.000100")
    assert "Nothing was changed: this proposal no longer exists in any cluster this bot serves" in clusters.told()[-1]
    # the message says which cluster: then the answer names it
    clusters.click("gamma-inference-vllm-oom-0123abcd|" + "0" * 64, "1700000000.000200",
                   message_text="[gamma] inference/vllm: KV cache does not fit")
    assert "Nothing was changed: this bot does not serve cluster `gamma` (it serves `alpha`, `beta`)" \
        in clusters.told()[-1]
    assert clusters.patches("alpha") == [] and clusters.patches("beta") == []
    assert clusters.args("alpha") == ARGS and clusters.args("beta") == ARGS
    assert clusters.incidents("alpha") == [] and clusters.incidents("beta") == []


def test_readyz_waits_for_every_cluster_and_names_the_one_not_answering(kube_api, kube_api_b, slack, tmp_path,
                                                                         monkeypatch):
    kube_api_b.fail("list", "vllmincidents", 403)  # beta's API refuses the bot
    world = TwoClusters(kube_api, kube_api_b, slack, tmp_path, monkeypatch, wait_ready=False)
    try:
        assert slack.wait_for(lambda: "kubernetes alpha" in world.server.readiness.passed, 30)
        status, text = http(world.server.url + "/readyz")
        assert status == 503 and "kubernetes beta" in text and "kubernetes alpha" not in text
    finally:
        world.stop()


def test_the_sweep_runs_in_every_cluster_and_one_cluster_down_does_not_stop_the_others(kube_api, kube_api_b, slack,
                                                                                      tmp_path, monkeypatch):
    world = TwoClusters(kube_api, kube_api_b, slack, tmp_path, monkeypatch, VLLM_ONCALL_SLACK_MAX_ATTEMPTS="1")
    try:
        # beta's incident is opened but Slack certainly refuses its post (a 429: nothing was posted)
        slack.fail_next("chat.postMessage", status=429, retry_after=0)
        world.alerts("beta")
        assert slack.wait_for(lambda: len(world.incidents("beta")) == 1, 30)
        assert slack.wait_for(lambda: slack.attempts("chat.postMessage"), 10)
        assert slack.wait_for(lambda: json.loads(world.incidents("beta")[0]["spec"]["record"]).get("post_lease") is None, 10)
        kube_api.fail("list", "vllmincidents", 503)  # alpha's API keeps failing
        world.server.router.sweep()
        assert slack.wait_for(lambda: len(world.posted_in("beta")) == 1, 20), "beta's sweep never posted"
    finally:
        world.stop()


def crash_again(kube, pod: str) -> None:
    """What the kubelet does at the next termination: a restart, a new lastState.terminated."""
    def mutate(obj: dict) -> None:
        cs = obj["status"]["containerStatuses"][0]
        cs["restartCount"] = cs.get("restartCount", 0) + 1
        cs["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": "2026-11-30T06:00:00Z",
                                          "finishedAt": "2026-11-30T06:01:30Z"}}
    kube.edit("Pod", pod, NS, mutate)


def test_the_pod_watch_runs_in_every_cluster_and_a_crash_opens_the_incident_in_its_own(kube_api, kube_api_b, slack,
                                                                                      tmp_path, monkeypatch):
    world = TwoClusters(kube_api, kube_api_b, slack, tmp_path, monkeypatch, VLLM_ONCALL_WATCH="true",
                        VLLM_ONCALL_WATCH_NAMESPACES=NS)
    try:
        assert kube_api.wait_for_watchers(1, timeout=30) and kube_api_b.wait_for_watchers(1, timeout=30)
        crash_again(kube_api_b, world.pods["beta"])
        assert slack.wait_for(lambda: len(world.posted_in("beta")) == 1, 30), "beta's crash was not posted"
        assert len(world.incidents("beta")) == 1 and world.incidents("alpha") == []
        crash_again(kube_api, world.pods["alpha"])
        assert slack.wait_for(lambda: len(world.posted_in("alpha")) == 1, 30), "alpha's crash was not posted"
        assert len(world.incidents("alpha")) == 1 and len(world.incidents("beta")) == 1
    finally:
        world.stop()
