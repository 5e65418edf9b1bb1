"""Roll back is as safe as Approve (issue 17, 1-3): it undoes exactly the change its own incident
applied, found in the audit record of the workload the incident is about, and nothing else.
Through the real wiring below the Slack button (OncallService.roll_back, as the Bolt action calls
it), with the real kubernetes client against the API stand-in (incidents stored there as
VLLMIncident objects, where anyone with write access could edit them) and the Slack stand-in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import EXAMPLE_LOG, NEW_POD_LOG
from kubeapi.objects import container, crashing_deployment, rollout_controller, start_pod

from bot.app.policy import ApproverScope
from bot.app.records import AlertTarget
from bot.app.service import OncallService, Policy
from bot.kube.api import KubeApi
from bot.kube.incidents import KubeIncidentStore
from bot.kube.live import LiveCluster
from bot.kube.retry import RetryPolicy
from bot.remedy.models import Proposal
from bot.remedy.plan import read_audit
from bot.slack.chat import SlackChat, make_client

ADMIN, TEAM_A = "U0ADMIN", "U0TEAMA"  # approves everywhere; approves namespace team-a only
ARGS = ["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bundles"
GRAPH_LOG = (FIXTURES / "graph-v1-0.11-piecewise-hint" / "previous.log").read_text()
SHM_LOG = (FIXTURES / "shm-v1-0.27-insufficient" / "previous.log").read_text()


class World:
    def __init__(self, kube, slack):
        self.kube, self.slack = kube, slack
        for namespace, name in (("team-a", "vllm-a"), ("team-b", "wb1")):
            crashing_deployment(kube, name=name, namespace=namespace, previous_log=EXAMPLE_LOG, containers=[
                container(command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"], args=list(ARGS))])
        kube.on_write = rollout_controller("ready", log=NEW_POD_LOG)  # every fix rolls out Ready
        self.api = KubeApi(kube.api_client(), retry=RetryPolicy(attempts=2, sleep=lambda s: None))
        self.store = KubeIncidentStore(self.api, "vllm-oncall")
        self.service = self.make_service()

    def make_service(self, proposals_only: bool = False) -> OncallService:
        chat = SlackChat(make_client("xoxb-rollback", self.slack.url), "C0ALERTS", max_attempts=2,
                         backoff_seconds=0.001, sleep=lambda s: None)
        policy = Policy(approver_users=frozenset({ADMIN}), verify_timeout_seconds=5, proposals_only=proposals_only,
                        approver_scopes=(ApproverScope("team-a", frozenset({TEAM_A})),))
        return OncallService(LiveCluster(self.api, name="prod", poll_seconds=0.01), self.store, chat, policy,
                             metrics=chat.metrics)

    def crash(self, namespace: str, name: str, log: str, suffix: str) -> str:
        """A new pod of the workload's current template crash-loops with `log`; its alert's incident."""
        pod = start_pod(self.kube, self.kube.get("Deployment", name, namespace), "crashloop", previous_log=log,
                        suffix=suffix, restarts=3)
        incident = self.service.handle_alert(AlertTarget(namespace=namespace, pod=pod["metadata"]["name"],
                                                         container="vllm"))
        assert incident is not None and incident.state == "proposed", incident
        return incident.name

    def fix(self, namespace: str, name: str, log: str = EXAMPLE_LOG, suffix: str = "crash") -> str:
        """Crash, approve, and follow the rollout to verified."""
        incident = self.crash(namespace, name, log, suffix)
        assert self.service.approve(incident, ADMIN) == "applied"
        assert self.state(incident) == "verified"
        return incident

    def roll_back(self, name: str, user: str, service: OncallService | None = None) -> str:
        """The Roll back button on the incident's own message."""
        return (service or self.service).roll_back(name, user, self.store.get(name).message_ref())

    def state(self, name: str) -> str:
        return str(self.store.get(name).state)

    def container(self, name: str, namespace: str) -> dict:
        return self.kube.get("Deployment", name, namespace)["spec"]["template"]["spec"]["containers"][0]

    def spec(self, name: str, namespace: str) -> dict:
        return self.kube.get("Deployment", name, namespace)["spec"]["template"]["spec"]

    def patches(self) -> list:
        return [c for c in self.kube.calls if c.verb == "patch" and not c.dry_run
                and c.resource in ("deployments", "statefulsets")]

    def edit_proposal(self, name: str, edit, reseal: bool) -> None:
        """Someone with write access to VLLMIncident objects edits the stored proposal."""
        obj = self.kube.get("VLLMIncident", name, "vllm-oncall")
        record = json.loads(obj["spec"]["record"])
        edit(record["proposal"])
        if reseal:
            record["proposal"] = Proposal.model_validate(record["proposal"]).sealed().model_dump(mode="json")
        self.kube.edit("VLLMIncident", name, "vllm-oncall", lambda o: o["spec"].update(record=json.dumps(record)))


@pytest.fixture
def world(kube_api, slack):
    return World(kube_api, slack)


def _to_team_b(proposal: dict) -> None:
    proposal["workload"].update(namespace="team-b", name="wb1")


def _to_team_b_everywhere(proposal: dict) -> None:
    _to_team_b(proposal)
    proposal["workload"]["uid"] = None


@pytest.mark.parametrize("user", [TEAM_A, ADMIN], ids=["team-a-approver", "admin"])
@pytest.mark.parametrize("edit, reseal", [(_to_team_b, False), (_to_team_b, True), (_to_team_b_everywhere, True)],
                         ids=["workload", "workload-resealed", "workload-and-uid-resealed"])
def test_an_incident_edited_to_name_another_namespace_patches_nothing_there(world, user, edit, reseal):
    incident = world.fix("team-a", "vllm-a")
    world.fix("team-b", "wb1")  # team-b's own change: what a rollback there would undo
    wb1_before, a_before = world.container("wb1", "team-b"), world.container("vllm-a", "team-a")
    patched = len(world.patches())
    world.edit_proposal(incident, edit, reseal)

    outcome = world.roll_back(incident, user)

    assert outcome in ("not_allowed", "wrong_target"), outcome
    assert world.patches()[patched:] == [], "nothing may be patched"
    assert world.container("wb1", "team-b") == wb1_before
    assert world.container("vllm-a", "team-a") == a_before
    assert [r for r in read_audit(world.kube.get("Deployment", "wb1", "team-b")) if r["action"] == "rollback"] == []


def test_rolling_back_the_first_of_two_changes_to_other_fields_undoes_only_the_first(world):
    first = world.fix("team-a", "vllm-a")  # --max-model-len 32768 -> 18432 (args)
    world.fix("team-a", "vllm-a", SHM_LOG, suffix="shmcr")  # a /dev/shm volume (volumes, volumeMounts)
    assert any(v.get("name") for v in world.spec("vllm-a", "team-a").get("volumes") or [])

    assert world.roll_back(first, ADMIN) == "rolled-back"

    spec = world.spec("vllm-a", "team-a")
    assert spec["containers"][0]["args"] == ARGS  # the first change is undone
    assert spec.get("volumes") and spec["containers"][0].get("volumeMounts")  # the second is still there
    records = read_audit(world.kube.get("Deployment", "vllm-a", "team-a"))
    first_id = world.store.get(first).proposal.id
    assert [r["id"] for r in records if r.get("rolled_back_by")] == [first_id]
    assert world.state(first) == "rolled-back"


def test_rolling_back_the_first_of_two_changes_to_the_same_fields_is_refused_saying_why(world):
    first = world.fix("team-a", "vllm-a")  # --max-model-len 32768 -> 18432
    second = world.fix("team-a", "vllm-a", GRAPH_LOG, suffix="graph")  # adds --enforce-eager
    args_now = world.container("vllm-a", "team-a")["args"]
    assert "--enforce-eager" in args_now and "18432" in args_now
    patched = len(world.patches())

    assert world.roll_back(first, ADMIN) == "failed"

    assert world.patches()[patched:] == []
    assert world.container("vllm-a", "team-a")["args"] == args_now  # neither change undone
    second_id = world.store.get(second).proposal.id
    replies = [c.params.get("text", "") for c in world.slack.replies()]
    assert any("Rollback failed" in r and f"change {second_id}" in r and "args" in r for r in replies), replies
    assert world.state(second) == "verified"


def test_the_last_change_rolls_back_by_its_own_record(world):
    world.fix("team-a", "vllm-a")
    second = world.fix("team-a", "vllm-a", GRAPH_LOG, suffix="graph")
    assert world.roll_back(second, ADMIN) == "rolled-back"
    args = world.container("vllm-a", "team-a")["args"]
    assert "--enforce-eager" not in args and "18432" in args  # only the second change undone


def test_roll_back_in_proposals_only_mode_is_refused_and_patches_nothing(world):
    incident = world.fix("team-a", "vllm-a")
    patched = len(world.patches())
    proposals_only = world.make_service(proposals_only=True)

    assert world.roll_back(incident, ADMIN, proposals_only) == "proposals_only"

    assert world.patches()[patched:] == []
    assert world.state(incident) == "verified"
    told = [c.params["text"] for c in world.slack.delivered("chat.postEphemeral")]
    assert any("proposals-only" in t for t in told), told
