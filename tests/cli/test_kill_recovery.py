"""kill -9 at each step, with real processes: `python -m bot.cli serve` subprocesses over the
Kubernetes API stand-in (reached through a kubeconfig file; the VLLMIncident objects are the
store both processes share) and the Slack stand-in (clicks are signed Bolt requests to the
process's own /slack/events). The first process is SIGKILLed while an answer it waits for is
pending, at one step each: the incident's post, the approval's claim (proposed -> applying), the
Deployment patch, the move to `applied` before its report, and verification. A second process
(a replica already running, or the restarted bot) must then finish the job.

What every case measures: the incident ends `verified` (none stuck in proposed/applying/applied),
one real (non-dry-run) patch of the Deployment and one audit record on it, one top-level Slack
message for the incident, exactly one "Applied by" reply in its thread.

The recovery time-outs are short (VLLM_ONCALL_POST_LEASE_SECONDS, VLLM_ONCALL_APPLY_GRACE_SECONDS,
VLLM_ONCALL_SLACK_TIMEOUT_SECONDS, VLLM_ONCALL_SWEEP_INTERVAL_SECONDS), so the whole file runs in
well under a minute of waiting.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from builders import EXAMPLE_LOG, NEW_POD_LOG, free_port, http, kubeconfig_for, wait_for
from kubeapi.objects import container, crashing_deployment, pod_status, rollout_controller
from kubeapi.vllmpod import ScriptedVllm
from slackapi.requests import button_value, click_body, signed_headers

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NS, DEPLOY, APPROVER, CHANNEL = "inference", "vllm-a", "U0APPROVER", "C0ALERTS"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ARGS = ["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"]
SECRET = "kill-recovery-signing-secret"
# post lease, apply grace (a patch gets 2 s per attempt), Slack timeout: the lease must be more than twice the
# Slack timeout, which must outlast the moment between a held post and the kill even on a loaded machine.
LEASE, GRACE, SLACK_TIMEOUT = 7.0, 8.0, 3
HELD = 300.0  # how long a held answer is delayed: far longer than any step of the test (never waited out)
UP = 120  # bounds the wait for a `serve` process to be ready (its imports on a loaded machine)
STEP = 60  # bounds every other wait: only a failure waits it out





class Bot:
    """One `serve` process: its own port and log file."""

    def __init__(self, env: dict[str, str], name: str, folder: Path):
        self.name, self.port = name, free_port()
        self.log = folder / f"bot-{name}.log"
        self.url = f"http://127.0.0.1:{self.port}"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "bot.cli", "serve"],
                                         env={**env, "VLLM_ONCALL_ALERTS_UNAUTHENTICATED": "true", "VLLM_ONCALL_LISTEN": f"127.0.0.1:{self.port}"},
                                         cwd=folder, stdout=out, stderr=subprocess.STDOUT, text=True)

    def ready(self, timeout: float = UP) -> None:
        ok = wait_for(lambda: self.proc.poll() is None and http(self.url + "/readyz")[0] == 200, timeout, 0.1)
        assert ok, f"bot {self.name} never became ready:\n{self.log.read_text()[-3000:]}"

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL: no handler runs, no answer is waited for
        self.proc.wait(10)
        assert self.proc.returncode == -9

    def reap(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def metric(self, name: str) -> float:
        for line in http(self.url + "/metrics")[1].splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return 0.0


class World:
    def __init__(self, kube, slack, folder: Path):
        self.kube, self.slack, self.folder = kube, slack, folder
        self.bots: list[Bot] = []
        kubeconfig = kubeconfig_for(kube.url, folder / "kubeconfig")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_SERVICE", "VLLM_ONCALL_"))}
        self.env = {**env, "KUBECONFIG": kubeconfig, "PYTHONPATH": str(ROOT),
                    "VLLM_ONCALL_CLUSTER": "prod", "SLACK_BOT_TOKEN": "xoxb-kill", "SLACK_SIGNING_SECRET": SECRET,
                    "SLACK_API_URL": slack.url, "VLLM_ONCALL_SLACK_CHANNEL": CHANNEL,
                    "VLLM_ONCALL_APPROVERS": APPROVER, "VLLM_ONCALL_STORE": "kube",
                    "VLLM_ONCALL_INCIDENT_NAMESPACE": "vllm-oncall", "VLLM_ONCALL_CLUSTER_SOURCE": "kube",
                    "VLLM_ONCALL_DEFAULT_NAMESPACE": NS, "VLLM_ONCALL_VERIFY_TIMEOUT_SECONDS": "30",
                    "VLLM_ONCALL_VERIFY_SOAK_SECONDS": "0", "VLLM_ONCALL_VERIFY_REQUEST_TIMEOUT_SECONDS": "3",
                    "VLLM_ONCALL_SWEEP_INTERVAL_SECONDS": "0.3", "VLLM_ONCALL_SLACK_MAX_ATTEMPTS": "2",
                    "VLLM_ONCALL_POST_LEASE_SECONDS": str(LEASE), "VLLM_ONCALL_APPLY_GRACE_SECONDS": str(GRACE),
                    "VLLM_ONCALL_SLACK_TIMEOUT_SECONDS": str(SLACK_TIMEOUT)}

    def start(self, *names: str) -> list[Bot]:
        bots = [Bot(self.env, name, self.folder) for name in names]
        self.bots.extend(bots)
        for bot in bots:
            bot.ready()
        return bots

    def reap(self) -> None:
        for bot in self.bots:
            bot.reap()

    def logs(self) -> str:
        return "\n".join(f"--- bot {b.name}\n{b.log.read_text()[-4000:]}" for b in self.bots)

    # ---- what goes in ---------------------------------------------------------------------

    def alert(self, bot: Bot) -> None:
        pod = next(p["metadata"]["name"] for p in self.kube.list("Pod", NS)
                   if p["metadata"]["name"].startswith(DEPLOY + "-"))
        body = json.dumps({"version": "4", "status": "firing", "receiver": "vllm-oncall", "groupKey": "k",
                           "alerts": [{"status": "firing", "labels": {"alertname": "KubePodCrashLooping",
                                                                     "namespace": NS, "pod": pod,
                                                                     "container": "vllm"}}]}).encode()
        assert http(bot.url + "/alerts", body, {"Content-Type": "application/json"})[0] == 200

    def posted(self, bot: Bot) -> tuple[str, str]:
        """Alert `bot` and wait for the incident's message; returns (message ts, Approve value)."""
        self.alert(bot)
        assert wait_for(lambda: self.record().get("slack_ts"), STEP), \
            f"the incident was never posted: record {sorted(self.record())}, Slack calls {[(c.method, c.status, c.ok) for c in list(self.slack.calls)]}" \
            f"\n{self.logs()}"
        self.quiet()
        return self.record()["slack_ts"], self.approve_value()

    def approve_value(self) -> str:
        (post,) = self.slack.posts()
        value = button_value(post, "vllm_approve")
        assert value and value.startswith(self.record()["name"] + "|")
        return value

    def click(self, bot: Bot, value: str, ts: str) -> None:
        body = click_body("vllm_approve", value, APPROVER, ts, CHANNEL)
        headers = {k: v[0] for k, v in signed_headers(body, SECRET).items()}
        status, _ = http(bot.url + "/slack/events", body.encode(), headers)
        assert status == 200, "the signed click was not accepted"

    # ---- what happened --------------------------------------------------------------------

    def record(self) -> dict:
        objs = self.kube.list("VLLMIncident", "vllm-oncall")
        if not objs:
            return {}
        (obj,) = objs
        return {**json.loads(obj["spec"]["record"]), "name": obj["metadata"]["name"], "state": obj["spec"]["state"]}

    def patches(self) -> list:
        return [c for c in self.kube.calls if c.verb == "patch" and not c.dry_run and c.resource == "deployments"]

    def audit(self) -> list:
        annotations = self.kube.get("Deployment", DEPLOY, NS)["metadata"].get("annotations") or {}
        return json.loads(annotations.get("vllm-oncall.io/last-change", "[]"))

    def replies(self, text: str) -> list[str]:
        return [c.params["text"] for c in self.slack.replies() if text in c.params.get("text", "")]

    def quiet(self, still: float = 0.5, timeout: float = 10) -> None:
        """Wait until Slack has seen no call for `still` seconds."""
        seen, since, deadline = len(self.slack.calls), time.monotonic(), time.monotonic() + timeout
        while time.monotonic() < deadline and time.monotonic() - since < still:
            time.sleep(0.05)
            if len(self.slack.calls) != seen:
                seen, since = len(self.slack.calls), time.monotonic()

    def recovered_exactly_once(self, timeout: float = 2 * STEP) -> None:
        done = wait_for(lambda: self.record().get("state") not in ("proposed", "applying", "applied"), timeout, 0.1)
        assert done, f"stuck in {self.record().get('state')}:\n{self.logs()}"
        # the reports may follow the last state write: wait for them, then a short look for any second one
        wait_for(lambda: self.replies("Applied by") and self.replies("is Ready"), STEP, 0.05)
        self.quiet()
        assert self.record()["state"] == "verified", self.logs()
        assert len(self.patches()) == 1, "one real patch of the workload"
        assert len(self.audit()) == 1 and self.audit()[0]["id"] == self.record()["proposal"]["id"]
        live = self.kube.get("Deployment", DEPLOY, NS)["spec"]["template"]["spec"]["containers"][0]["args"]
        assert live[:2] == ["--max-model-len", "18432"]
        assert len(self.slack.channel_messages(CHANNEL)) == 1, "one top-level message for the incident"
        assert self.slack.channel_messages(CHANNEL)[0]["ts"] == self.record()["slack_ts"]
        assert len(self.replies("Applied by")) == 1, f"one 'Applied by' reply: {self.replies('Applied')}"
        assert len(self.replies("is Ready")) == 1, "verification reported once"


@pytest.fixture
def world(kube_api, slack, tmp_path):
    crashing_deployment(kube_api, name=DEPLOY, previous_log=EXAMPLE_LOG, containers=[container(
        command=["vllm", "serve", MODEL], args=list(ARGS))])
    kube_api.on_write = rollout_controller("ready", log=NEW_POD_LOG)
    vllm = ScriptedVllm(model=MODEL).start()  # the new pod answers the completion request of step 3
    kube_api.default_pod_backend = vllm.url
    w = World(kube_api, slack, tmp_path)
    try:
        yield w
    finally:
        w.reap()
        vllm.stop()


def test_kill_mid_post_a_replica_finds_the_message_after_the_lease_and_posts_nothing_more(world, slack):
    first, second = world.start("a", "b")  # two replicas of one bot
    slack.slow_next("chat.postMessage", HELD)  # Slack posts it, the answer comes late
    world.alert(first)
    assert wait_for(lambda: len(slack.channel_messages(CHANNEL)) == 1, STEP), \
        f"never exactly one post: {slack.channel_messages(CHANNEL)}\n{world.logs()}"
    (attempt,) = slack.attempts("chat.postMessage")
    pending = time.monotonic() - attempt.at
    first.kill()  # the post exists, its answer is pending
    assert pending < SLACK_TIMEOUT, "killed while the bot was still waiting for the answer"
    record = world.record()
    assert record["post_key"] and not record.get("slack_ts"), "the killed bot never learnt the ts"
    # The replica waits out the lease, finds the key in the channel's history, posts nothing.
    assert wait_for(lambda: world.record().get("slack_ts"), LEASE + STEP, 0.1), world.logs()
    assert world.record()["slack_ts"] == slack.channel_messages(CHANNEL)[0]["ts"]
    assert len([c for c in slack.attempts("chat.postMessage") if not c.params.get("thread_ts")]) == 1, "no second post"
    assert wait_for(lambda: second.metric("vllm_oncall_posts_recovered_total") == 1, STEP)
    assert second.metric("vllm_oncall_incidents_posted_total") == 1
    world.quiet()
    world.click(second, world.approve_value(), world.record()["slack_ts"])  # Approve on the message found
    world.recovered_exactly_once()


def test_kill_after_the_claim_committed_a_replica_applies_it_after_the_grace(world, kube_api):
    first, second = world.start("a", "b")
    ts, value = world.posted(first)
    # The claim's write (proposed -> applying) commits; its answer is held.
    kube_api.fail_commit("patch", "vllmincidents", "after", "slow", seconds=HELD)
    world.click(first, value, ts)
    assert wait_for(lambda: world.record()["state"] == "applying", STEP), world.logs()
    first.kill()
    assert world.patches() == [], "killed before the patch"
    claimed_at = time.monotonic()
    world.recovered_exactly_once()
    assert time.monotonic() - claimed_at > GRACE - 1, "taken over only after the apply grace"
    assert "resuming the apply" in json.dumps(world.record()["history"])


def test_kill_while_the_patch_answer_is_pending_the_restarted_bot_reads_the_audit_record(world, kube_api):
    (first,) = world.start("a")
    ts, value = world.posted(first)
    kube_api.fail_commit("patch", "deployments", "after", "slow", seconds=HELD)  # patched; the answer is held
    world.click(first, value, ts)
    assert wait_for(lambda: len(world.audit()) == 1, STEP), world.logs()
    first.kill()
    assert world.record()["state"] == "applying", "killed before the bot learnt the patch's outcome"
    world.start("a2")  # the restarted bot
    world.recovered_exactly_once()  # one patch: the killed bot's, whose answer nobody read
    assert "patch applied by" in json.dumps(world.record()["history"])


def test_kill_after_the_move_to_applied_the_restarted_bot_reports_and_verifies(world, kube_api):
    (first,) = world.start("a")
    ts, value = world.posted(first)
    controller = kube_api.on_write

    def then_hold_the_next_incident_write(fake, new, old):  # right after the patch: the move to applied
        controller(fake, new, old)
        fake.fail_commit("patch", "vllmincidents", "after", "slow", seconds=HELD)

    kube_api.on_write = then_hold_the_next_incident_write
    world.click(first, value, ts)
    assert wait_for(lambda: world.record()["state"] == "applied", STEP), world.logs()
    first.kill()
    assert world.replies("Applied by") == [], "killed before the report"
    world.start("a2")
    world.recovered_exactly_once()


def test_kill_during_verification_the_restarted_bot_resumes_it_and_reports_it_once(world, kube_api):
    kube_api.on_write = rollout_controller("starting", log=NEW_POD_LOG)  # the new pod is slow to be Ready
    (first,) = world.start("a")
    ts, value = world.posted(first)
    world.click(first, value, ts)
    assert wait_for(lambda: world.record().get("verification_step") == "ready" and world.replies("Applied by"),
                    STEP), world.logs()
    first.kill()
    assert world.record()["state"] == "applied" and world.replies("is Ready") == []
    (new_pod,) = [p for p in kube_api.list("Pod", NS) if p["metadata"]["name"].endswith("-newpd")]
    kube_api.edit("Pod", new_pod["metadata"]["name"], NS,
                  lambda pod: pod.update(status=pod_status("vllm", "ready")))  # Ready at last
    world.start("a2")
    world.recovered_exactly_once()
    assert len(world.replies("restarted during verification")) == 1


def test_a_replica_already_running_leaves_a_live_verification_alone_and_resumes_it_once_its_replica_dies(
        world, kube_api):
    kube_api.on_write = rollout_controller("starting", log=NEW_POD_LOG)  # the new pod is slow to be Ready
    first, second = world.start("a", "b")
    ts, value = world.posted(first)
    world.click(first, value, ts)
    assert wait_for(lambda: world.record().get("verify_lease") and world.replies("Applied by"), STEP), world.logs()
    leased = world.record()["verify_lease"]  # its verification is under way, waiting for Ready
    # Until the first replica renewed its lease after the original one ran out: longer than the
    # grace, its sweeps kept renewing it (each renewal runs GRACE from its own moment).
    until = datetime.fromisoformat(leased["until"])
    assert wait_for(lambda: datetime.fromisoformat(world.record()["verify_lease"]["until"]) > until + timedelta(
        seconds=GRACE), GRACE + STEP, 0.1), world.logs()
    assert world.replies("resuming it") == [], "a live replica's verification was taken over"
    renewed = world.record()["verify_lease"]
    assert renewed["holder"] == leased["holder"] and renewed["until"] > leased["until"]
    first.kill()
    (new_pod,) = [p for p in kube_api.list("Pod", NS) if p["metadata"]["name"].endswith("-newpd")]
    kube_api.edit("Pod", new_pod["metadata"]["name"], NS,
                  lambda pod: pod.update(status=pod_status("vllm", "ready")))  # Ready at last
    world.recovered_exactly_once()  # the second replica, running all along, took it over once the lease ran out
    assert len(world.replies("resuming it")) == 1
    assert second.proc.poll() is None
