"""From evidence to a diagnosis and an approvable proposal (the cluster side binds and dry-runs it)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from bot.app.policy import PROPOSALS_ONLY, Policy
from bot.app.ports import ClusterPort
from bot.app.state import IncidentState
from bot.diagnosis.evidence import gpu_summary, node_view, pod_view
from bot.diagnosis.models import DiagnosisResult, Evidence
from bot.remedy.models import Proposal, WorkloadRef


def offers_button(proposal: Proposal | None) -> bool:
    """A live patch can be approved: there is one, nothing blocks it, and its dry run passed."""
    return (proposal is not None and not proposal.workload.live_patch_blocked and proposal.dry_run_ok is not False
            and not proposal.approvals_off and bool(proposal.json_patch or proposal.changes))


def open_state(proposal: Proposal | None) -> IncidentState:
    """The state an incident (re)opens in with this proposal."""
    return IncidentState.PROPOSED if offers_button(proposal) else IncidentState.DIAGNOSED


class Proposer:
    def __init__(self, cluster: ClusterPort, diagnose: Callable[[Evidence], DiagnosisResult], policy: Policy,
                 clock: Callable[[], datetime]):
        self.cluster, self._diagnose, self.policy, self.clock = cluster, diagnose, policy, clock

    def diagnose(self, evidence: Evidence) -> DiagnosisResult:
        """The core's diagnosis, with the header facts (node, GPU, restarts) filled from the
        evidence where the core left them empty."""
        diagnosis = self._diagnose(evidence)
        pod, node = pod_view(evidence), node_view(evidence)
        return diagnosis.model_copy(update={
            "namespace": diagnosis.namespace or pod.namespace or None,
            "pod": diagnosis.pod or pod.name or None,
            "container": diagnosis.container or (pod.container.name if pod.container else None),
            "node": diagnosis.node or pod.node_name or node.name,
            "gpu": diagnosis.gpu or gpu_summary(node),
            "restarts": diagnosis.restarts if diagnosis.restarts is not None else (
                pod.container.restart_count if pod.container else None),
        })

    def propose(self, diagnosis: DiagnosisResult, evidence: Evidence, workload: WorkloadRef) -> Proposal | None:
        if not diagnosis.cause or not diagnosis.changes:
            return None
        proposal = self.cluster.propose(diagnosis, evidence, workload)
        if proposal is None:
            return None
        # The configured time-to-live wins over whatever the cluster side suggested.
        created = self.clock()
        update: dict[str, object] = {"created_at": created, "expires_at": created + self.policy.proposal_ttl}
        if self.policy.proposals_only:
            update["approvals_off"] = PROPOSALS_ONLY
        return proposal.model_copy(update=update)
