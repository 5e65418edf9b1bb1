"""The proposals-only install's role is read-only: the server-side dry run of a proposal is then
forbidden (RBAC treats a dry run as the write it tests). The bot still proposes the change, offers
no button, and says which permission approve mode adds."""

from __future__ import annotations

from kubeapi.objects import container, crashing_deployment

from bot.app.proposals import offers_button
from bot.diagnosis.models import Change, DiagnosisResult
from bot.kube.api import KubeApi
from bot.kube.live import LiveCluster
from bot.kube.retry import RetryPolicy

NS = "inference"


def test_a_forbidden_dry_run_still_gives_the_proposal_without_a_button(kube_api):
    api = KubeApi(kube_api.api_client(), retry=RetryPolicy(initial=0.001, maximum=0.002, sleep=lambda s: None))
    cluster = LiveCluster(api, name="ro", poll_seconds=0.001)
    _, pod = crashing_deployment(kube_api, containers=[container(args=["--model", "m", "--max-model-len", "32768"])],
                                 previous_log="boom\n")
    kube_api.fail("patch", "deployments", 403, message='deployments.apps "llama" is forbidden')
    change = Change(kind="flag", name="--max-model-len", before="32768", after="8192")
    result = DiagnosisResult(cause="kv-cache-max-model-len", title="t", explanation="e", changes=[change])
    proposal = cluster.propose(result, cluster.collect(NS, cluster.resolve_pod(NS, "llama")))
    assert proposal is not None and proposal.json_patch  # the change is still shown
    assert proposal.dry_run_ok is False and not offers_button(proposal)
    assert proposal.dry_run_message.startswith("not run: the bot's role may not patch deployments")
    assert "in namespace inference" in proposal.dry_run_message and "approve mode grants it" in proposal.dry_run_message
    assert ("patch", "deployments") in {(v, r) for v, _, r in kube_api.called()}  # it was tried, and refused
