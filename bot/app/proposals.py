"""From evidence to a diagnosis and an approvable proposal (the cluster side binds and dry-runs it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bot.app.incidents import incident_name
from bot.app.policy import PROPOSALS_ONLY, Policy
from bot.app.ports import ClusterPort, TrafficHistory
from bot.app.redaction import mark_redacted
from bot.app.state import IncidentState
from bot.diagnosis.evidence import gpu_summary, node_view, pod_view
from bot.diagnosis.models import DiagnosisResult, Evidence, revised
from bot.remedy.impact import (
    GENERATION,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    PROMPT,
    RUNNING,
    WAITING,
    Impact,
    max_model_len_impact,
    max_num_seqs_impact,
    not_known,
)
from bot.remedy.models import Proposal, WorkloadRef
from bot.remedy.plan import redact_proposal


def offers_button(proposal: Proposal | None) -> bool:
    """A live patch can be approved: there is one, nothing blocks it, and its dry run passed."""
    return (proposal is not None and not proposal.workload.live_patch_blocked and proposal.dry_run_ok is not False
            and not proposal.approvals_off and bool(proposal.json_patch or proposal.changes))


def open_state(proposal: Proposal | None) -> IncidentState:
    """The state an incident (re)opens in with this proposal."""
    return IncidentState.PROPOSED if offers_button(proposal) else IncidentState.DIAGNOSED


IMPACT_HOURS = 24.0  # the window of traffic a new limit is measured against


def impact_of(proposal: Proposal, traffic: TrafficHistory | None) -> Impact | None:
    """What a new --max-model-len would have refused (or a new --max-num-seqs queued) of the last
    IMPACT_HOURS of the workload's traffic, or why that cannot be known; None when the proposal
    sets neither limit."""
    flag, limit = next(((c.name, int(c.after)) for c in proposal.changes
                        if c.name in (MAX_MODEL_LEN, MAX_NUM_SEQS) and c.after and c.after.isdigit()), (None, 0))
    if flag is None:
        return None
    if traffic is None:
        return not_known(flag, limit, "no Prometheus is configured to read vLLM's metrics from", IMPACT_HOURS)
    w = proposal.workload
    try:
        if flag == MAX_NUM_SEQS:
            return max_num_seqs_impact(traffic.share_above(w.namespace, w.name, RUNNING, limit, IMPACT_HOURS),
                                       traffic.share_above(w.namespace, w.name, WAITING, 0, IMPACT_HOURS),
                                       limit, IMPACT_HOURS)
        found = traffic.histograms(w.namespace, w.name, [PROMPT, GENERATION], IMPACT_HOURS)
    except Exception as exc:  # information, never a reason not to propose: say why it is unknown
        return not_known(flag, limit, str(exc), IMPACT_HOURS)
    return max_model_len_impact(found.get(PROMPT), found.get(GENERATION), limit, IMPACT_HOURS)


class Proposer:
    def __init__(self, cluster: ClusterPort, diagnose: Callable[[Evidence], DiagnosisResult], policy: Policy,
                 clock: Callable[[], datetime], traffic: TrafficHistory | None = None):
        self.cluster, self._diagnose, self.policy, self.clock = cluster, diagnose, policy, clock
        self.traffic = traffic  # None: no Prometheus, the impact of a new limit cannot be known

    def diagnose(self, evidence: Evidence) -> DiagnosisResult:
        """The core's diagnosis, with the header facts (node, GPU, restarts) filled from the
        evidence where the core left them empty."""
        diagnosis = self._diagnose(evidence)
        if diagnosis.namespace and diagnosis.pod and diagnosis.container and diagnosis.node and diagnosis.gpu \
                and diagnosis.restarts is not None:
            return diagnosis  # every header fact filled by the core: nothing to read from the evidence again
        pod, node = pod_view(evidence), node_view(evidence)
        return revised(
            diagnosis,
            namespace=diagnosis.namespace or pod.namespace or None,
            pod=diagnosis.pod or pod.name or None,
            container=diagnosis.container or (pod.container.name if pod.container else None),
            node=diagnosis.node or pod.node_name or node.name,
            gpu=diagnosis.gpu or gpu_summary(node),
            restarts=diagnosis.restarts if diagnosis.restarts is not None else (
                pod.container.restart_count if pod.container else None),
        )

    def propose(self, diagnosis: DiagnosisResult, evidence: Evidence, workload: WorkloadRef) -> Proposal | None:
        if not diagnosis.cause or not diagnosis.changes:
            return None
        proposal = self.cluster.propose(diagnosis, evidence, workload)
        if proposal is None:
            return None
        # The configured time-to-live wins over whatever the cluster side suggested.
        created = self.clock()
        update: dict[str, object] = {"created_at": created, "expires_at": created + self.policy.proposal_ttl,
                                     "impact": impact_of(proposal, self.traffic)}
        if self.policy.proposals_only:
            update["approvals_off"] = PROPOSALS_ONLY
        # Sealed as it will be stored and shown: secrets in command lines and patch values masked
        # (the apply path restores them from the live object), so the digest the button carries
        # is the digest of the stored record.
        redactor = self.policy.redactor
        return mark_redacted(redact_proposal(proposal, redactor, **update).sealed(), redactor)

    def recheck(self, name: str, stored: Proposal) -> Recheck:
        """Re-derive incident `name`'s proposal now, from the live workload, its pod's evidence
        and the playbooks, and compare it with the `stored` one (which is data in the incident
        store that someone may have edited). Only `Recheck.ok` may be applied."""
        if stored.digest and not stored.intact():  # "": a record from before digests; re-derived all the same
            return Recheck(refused="the stored proposal was edited (its digest does not match its content)")
        w = stored.workload
        if stored.cluster != self.cluster.name or incident_name(self.cluster.name, w.namespace, w.name,
                                                                stored.cause) != name:
            return Recheck(refused=f"the stored proposal names {w.kind} {w.namespace}/{w.name} ({stored.cause}) "
                                   f"in cluster {stored.cluster}, which is not what incident {name} is about")
        try:
            pod = self.cluster.resolve_pod(w.namespace, w.name)
            evidence = self.cluster.collect(w.namespace, pod, w.container)
            diagnosis = self.diagnose(evidence)
            fresh = self.propose(diagnosis, evidence, self.cluster.workload_for(evidence))
        except Exception as exc:  # nothing re-derived: nothing applied
            return Recheck(refused=f"could not re-derive the proposal from the cluster: {type(exc).__name__}: {exc}")
        if fresh is None:
            return Recheck(refused="re-deriving it now proposes no change", diagnosis=diagnosis)
        if fresh.target() != stored.target():
            return Recheck(refused="the stored proposal's target is not the workload it was derived for "
                                   f"({_target_text(stored)} stored, {_target_text(fresh)} now)",
                           fresh=fresh, diagnosis=diagnosis)
        if fresh.container_before != stored.container_before or fresh.cause != stored.cause:
            return Recheck(conflict=True, fresh=fresh, diagnosis=diagnosis,  # edited since: re-propose
                           reason="Re-derived against the live workload: it was edited since the proposal.")
        if _comparable(fresh) != _comparable(stored):
            # The evidence now gives other values, or the stored record was edited: either way the
            # stored patch is not applied, and the incident is re-proposed from what is true now.
            return Recheck(conflict=True, fresh=fresh, diagnosis=diagnosis,
                           reason="The stored proposal's changes or patch are not what the playbook derives from "
                                  "the evidence now, so it was not applied.")
        return Recheck(ok=True, fresh=fresh, diagnosis=diagnosis)


@dataclass(frozen=True)
class Recheck:
    """What re-deriving a stored proposal found: ok (apply it), conflict (the workload was edited
    since: re-propose), or refused (why it must not be applied)."""

    ok: bool = False
    conflict: bool = False
    refused: str | None = None
    reason: str = ""  # for a conflict: what differs
    fresh: Proposal | None = None
    diagnosis: DiagnosisResult | None = None


def _target_text(p: Proposal) -> str:
    t = p.target()
    return f"{t['kind']} {t['namespace']}/{t['name']} uid {t['uid']} container {t['container']}"


def _comparable(p: Proposal) -> dict[str, Any]:
    """The content that must be equal: all of it but the id and the resourceVersion the patch is
    conditional on (status writes move it; apply re-bases the test on the version it reads, and
    the generation test, which only spec edits move, stays as derived)."""
    content = p.content()
    content.pop("id")
    content["json_patch"] = [{**op, "value": None} if op.get("op") == "test" and op.get("path") ==
                             "/metadata/resourceVersion" else op for op in p.json_patch]
    return content
