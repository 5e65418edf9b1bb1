"""Apply, was-applied, roll back and dry-run of a sealed proposal: each written once, here.

Both cluster adapters (bot.kube.live on an API server, bot.local.cluster on manifest copies)
delegate to these functions and only do the I/O of `WorkloadIO`: read a workload, patch it (or
dry-run the patch), record an Event. The rules themselves come from the pure core
(bot.remedy.plan); the order in which they are checked is this module's, the same for every
cluster:

apply:     live patch allowed -> the workload exists -> it is the same object (uid) -> already
           applied (its audit record says so) -> edited since the proposal -> the playbook allows
           every change and the stored patch is the one they make -> patch with `test` ops and the
           audit record; an ambiguous answer (5xx, timeout) is read back before it is reported.
roll back: the workload exists -> the change to undo is on it (by the incident's proposal id and
           digest when given) -> no later change touched its fields, nobody edited them ->
           patch guarded by `test` ops on the values that change introduced, audit record.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any, Protocol

from bot.app.errors import ClusterError
from bot.app.records import ApplyResult
from bot.diagnosis.models import DiagnosisResult
from bot.remedy import changes as ch
from bot.remedy import plan
from bot.remedy.models import Proposal, WorkloadRef

log = logging.getLogger(__name__)

CHANGE_EVENT, ROLLBACK_EVENT = "VllmOncallChange", "VllmOncallRollback"


class PatchStatus(StrEnum):
    PATCHED = "patched"  # written (for a dry run: accepted)
    CONFLICT = "conflict"  # nothing written: a `test` op did not hold, or the object moved under us
    REFUSED = "refused"  # nothing written: the server refused the patch itself (a dry run's answer)
    UNCERTAIN = "uncertain"  # an error after which the patch may have committed (5xx, timeout)


@dataclass(frozen=True)
class PatchAnswer:
    status: PatchStatus
    workload: dict[str, Any] | None = None  # the object after a patch that was written
    # Where it went, for people ("patched Deployment ns/name", "wrote /path"), or the server's words.
    message: str = ""


class WorkloadIO(Protocol):
    """The I/O the decisions above need from a cluster; nothing else."""

    name: str  # the cluster's name, in every Event

    def find_workload(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or None when there is no such object. Raises ClusterError when it cannot tell."""

    def patch_workload(self, kind: str, namespace: str, name: str, ops: list[dict[str, Any]],
                       dry_run: bool = False) -> PatchAnswer:
        """Apply the JSON Patch (all or nothing). Raises ClusterError when the patch is refused
        outright (forbidden, invalid: nothing was written); a dry run answers REFUSED instead."""

    def create_event(self, event: dict[str, Any]) -> None:
        """Record the audit Event (a courtesy: the annotation already holds the record)."""


# ---- proposing ------------------------------------------------------------------------------

def propose(io: WorkloadIO, ref: WorkloadRef, workload: dict[str, Any], diagnosis: DiagnosisResult,
            ttl: timedelta) -> Proposal | None:
    """The proposal for this diagnosis on `workload` as read, checked by a dry run of its patch."""
    proposal = plan.make_proposal(io.name, ref, workload, diagnosis, ttl)
    if proposal is None or ref.live_patch_blocked:
        return proposal
    answer = io.patch_workload(ref.kind, ref.namespace, ref.name, proposal.json_patch, dry_run=True)
    return plan.dry_run_checked(proposal, answer.status is PatchStatus.PATCHED, answer.message)


# ---- applying -------------------------------------------------------------------------------

def was_applied(io: WorkloadIO, proposal: Proposal) -> ApplyResult | None:
    ref = proposal.workload
    current = io.find_workload(ref.kind, ref.namespace, ref.name)
    return applied_result(proposal, current) if current is not None else None


def applied_result(proposal: Proposal, current: dict[str, Any]) -> ApplyResult | None:
    """An ok result if `current` carries this proposal's audit record: it was applied."""
    record = plan.applied_record(proposal, current)
    if record is None:
        return None
    ref = proposal.workload
    return ApplyResult(ok=True, changed_fields=plan.fields_changed_by(record),
                       workload=plan.at_version(ref, current["metadata"].get("resourceVersion")),
                       message=f"patched {ref.kind} {ref.namespace}/{ref.name}: {plan.describe_record(record)}")


def apply(io: WorkloadIO, proposal: Proposal, actor: str, playbooks: Any = None) -> ApplyResult:
    ref = proposal.workload
    if ref.live_patch_blocked:
        return ApplyResult(ok=False, workload=ref, message=f"not patched live: {ref.live_patch_blocked}")
    current = io.find_workload(ref.kind, ref.namespace, ref.name)
    if current is None:
        return ApplyResult(ok=False, workload=ref, message=f"{ref.kind} {ref.namespace}/{ref.name} no longer exists")
    if ref.uid and current["metadata"].get("uid") != ref.uid:
        return ApplyResult(ok=False, workload=ref, message=f"refused: {ref.kind} {ref.namespace}/{ref.name} was "
                                                           "deleted and re-created since the proposal")
    done = applied_result(proposal, current)  # an earlier attempt committed (its answer was lost)
    if done is not None:
        return done
    refused = edited_since(proposal, current)
    if refused:
        return refused
    forbidden = plan.not_allowed(proposal, current, playbooks)
    if forbidden:
        return ApplyResult(ok=False, workload=ref, message=f"refused: {forbidden}")
    audit, record = plan.change_ops(proposal, current, actor)
    ops = plan.rebase(proposal.json_patch, current)
    assert ops is not None  # edited_since checked it
    answer = io.patch_workload(ref.kind, ref.namespace, ref.name, ops + audit)
    if answer.status is not PatchStatus.PATCHED or answer.workload is None:
        return after_patch_error(io, proposal, answer)
    message = plan.describe_record(record)
    _event(io, answer.workload, CHANGE_EVENT, message)
    return ApplyResult(ok=True, changed_fields=plan.fields_changed_by(record), message=f"{answer.message}: {message}",
                       workload=plan.at_version(ref, answer.workload["metadata"].get("resourceVersion")))


def after_patch_error(io: WorkloadIO, proposal: Proposal, answer: PatchAnswer) -> ApplyResult:
    """The patch answered an error. It may have committed all the same (a 5xx or a timeout
    after the write; a retry of a committed patch then fails its own `test` ops): read the
    workload back, and its audit record says whether it did."""
    ref = proposal.workload
    try:
        latest = io.find_workload(ref.kind, ref.namespace, ref.name)
    except ClusterError as exc:
        return ApplyResult(ok=False, unknown=True, workload=ref,
                           message=f"the patch answered {answer.message!r} and reading it back failed "
                                   f"({exc}); whether it applied is checked again later")
    if latest is None:
        return ApplyResult(ok=False, workload=ref, message=f"{ref.kind} {ref.namespace}/{ref.name} no longer exists")
    done = applied_result(proposal, latest)
    if done is not None:
        log.warning("patch of %s/%s answered %s but had committed", ref.namespace, ref.name, answer.message)
        return done
    if answer.status is PatchStatus.CONFLICT:  # lost a race between our read and our write: say what changed
        return edited_since(proposal, latest) or ApplyResult(
            ok=False, conflict=True, workload=ref,
            message=f"{ref.kind} {ref.name} changed while patching ({answer.message}); re-diagnose")
    return ApplyResult(ok=False, workload=ref, message=f"not applied (read back: unchanged): {answer.message}")


def edited_since(proposal: Proposal, current: dict[str, Any]) -> ApplyResult | None:
    """A conflict result when the target container (or the spec elsewhere) changed since the
    proposal; None when only status or metadata moved."""
    ref = proposal.workload
    diff = plan.conflict_with(proposal, current)
    if diff is None and plan.rebase(proposal.json_patch, current) is not None:
        return None
    what = diff or "its spec was edited (generation changed) outside the container"
    fields = ch.changed_fields(proposal.container_before, ch.fields_of(ch.pod_spec_of(current), ref.container))
    return ApplyResult(ok=False, conflict=True, workload=ref, changed_fields=fields,
                       message=f"refused: {ref.kind} {ref.namespace}/{ref.name} was edited since the "
                               f"proposal (resourceVersion {ref.resource_version} -> "
                               f"{current['metadata'].get('resourceVersion')}); re-diagnose.\n{what}")


# ---- rolling back ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ChangeToUndo:
    """Which recorded change a rollback undoes: the proposal an incident applied (its id and
    digest, as the workload's own audit record names them). Without one: the newest change."""

    proposal_id: str
    digest: str = ""
    uid: str | None = None  # the object the change went to: one deleted and re-created is another

    def describe(self) -> str:
        return f"change {self.proposal_id}" + (f", proposal digest {self.digest[:12]}" if self.digest else "")


def roll_back(io: WorkloadIO, kind: str, namespace: str, name: str, actor: str,
              change: ChangeToUndo | None = None) -> ApplyResult:
    current = io.find_workload(kind, namespace, name)
    if current is None:
        return ApplyResult(ok=False, message=f"{kind} {namespace}/{name} does not exist")
    meta = current["metadata"]
    if change is not None and change.uid and meta.get("uid") != change.uid:
        return ApplyResult(ok=False, message=f"refused: {kind} {namespace}/{name} was deleted and re-created since "
                                             f"{change.describe()} was applied to it; nothing to roll back there")
    records = plan.read_audit(current)
    container = next((r["container"] for r in reversed(records)
                      if change is None or r.get("id") == change.proposal_id), "")
    ref = WorkloadRef(kind=kind, namespace=namespace, name=name, container=container,
                      resource_version=meta.get("resourceVersion"), uid=meta.get("uid"))
    try:
        ops, record = plan.rollback_ops(current, actor, change.proposal_id if change else None,
                                        change.digest if change else None)
    except plan.RollbackRefused as refused:
        return ApplyResult(ok=False, conflict=refused.conflict, workload=ref, message=f"refused: {refused}")
    answer = io.patch_workload(kind, namespace, name, ops)
    patched = answer.workload if answer.status is PatchStatus.PATCHED else _read_back_rollback(io, ref, record)
    if patched is None:
        conflict = answer.status is PatchStatus.CONFLICT
        why = (f"{kind} {name} changed while rolling back ({answer.message}); try again" if conflict
               else f"not rolled back: {answer.message}")
        return ApplyResult(ok=False, conflict=conflict, workload=ref, message=f"refused: {why}" if conflict else why)
    message = plan.describe_record(record)
    _event(io, patched, ROLLBACK_EVENT, message)
    return ApplyResult(ok=True, changed_fields=plan.fields_changed_by(record),
                       workload=plan.at_version(ref, patched["metadata"].get("resourceVersion")),
                       message=f"rolled back {kind} {namespace}/{name}: {message}"
                               + (f" (undid {change.describe()})" if change else ""))


def _read_back_rollback(io: WorkloadIO, ref: WorkloadRef, record: dict[str, Any]) -> dict[str, Any] | None:
    """After an error answer: the workload if this rollback landed all the same, else None."""
    try:
        latest = io.find_workload(ref.kind, ref.namespace, ref.name)
    except ClusterError as exc:
        log.warning("rollback of %s/%s: reading it back failed: %s", ref.namespace, ref.name, exc)
        return None
    return latest if latest is not None and plan.rolled_back_record(latest, record["id"]) else None


def _event(io: WorkloadIO, workload: dict[str, Any], reason: str, message: str) -> None:
    try:
        io.create_event(plan.event_for(workload, reason, f"{message} [cluster {io.name}]"))
    except ClusterError as exc:  # the annotation already holds the record; an Event is a courtesy
        log.warning("could not create the audit Event: %s", exc)
