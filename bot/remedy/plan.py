"""Proposals, conditional patches, audit records and rollbacks, computed from plain objects.

No I/O: bot.app.workload_ops, the one implementation of apply and roll back that both cluster
adapters (bot.kube.live, bot.local.cluster) delegate to, uses these, so the safety rules are the
same whether the patch goes to an API server or to a manifest copy.

The audit record lives on the workload itself, in the annotation `vllm-oncall.io/last-change`:
a JSON list (oldest first) of at most 5 records and at most 16 KiB. Each record:
  {"id", "action": "change"|"rollback", "who", "when", "cause", "container", "fields": [...],
   "before": {field: value-or-null}, "after": {field: value-or-null}, "rolled_back_by": id?,
   "digest": the proposal's digest (changes)}
A change record names its proposal by id and digest, so after an ambiguous answer (5xx after
commit, timeout) the apply step reads the workload back and knows whether the patch landed.
`before`/`after` always hold command and args, plus every other field the change touched
(env, volumeMounts, resources, probes, and the pod's volumes); null means "absent".
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from bot.diagnosis.models import DiagnosisResult, revised
from bot.diagnosis.redact import DEFAULT as DEFAULT_REDACTOR
from bot.diagnosis.redact import Redactor, has_mask, masked_match
from bot.remedy import changes as ch
from bot.remedy.models import Proposal, WorkloadRef
from bot.remedy.ownership import repository_hint

AUDIT_ANNOTATION = "vllm-oncall.io/last-change"
AUDIT_MAX_RECORDS = 5
AUDIT_MAX_BYTES = 16 * 1024
ALWAYS_RECORDED = ("command", "args")


def now() -> datetime:
    return datetime.now(UTC)


def argv(pod_spec: dict[str, Any], container: str) -> list[str]:
    c = pod_spec["containers"][ch.container_index(pod_spec, container)]
    return [str(x) for x in (c.get("command") or []) + (c.get("args") or [])]


def make_proposal(cluster: str, ref: WorkloadRef, workload: dict[str, Any], diagnosis: DiagnosisResult,
                  ttl: timedelta = timedelta(hours=1)) -> Proposal | None:
    """The proposal for this diagnosis on this exact workload state; None when there is nothing to change."""
    if diagnosis.cause is None or not diagnosis.changes:
        return None
    pod_spec = ch.pod_spec_of(workload)
    new_spec = ch.apply_changes(pod_spec, ref.container, diagnosis.changes)
    before = ch.fields_of(pod_spec, ref.container)
    if before == ch.fields_of(new_spec, ref.container):
        return None  # already as proposed: nothing to approve
    meta = workload.get("metadata") or {}
    ops: list[dict[str, Any]] = []
    manifest_diff = None
    hint = ref.repository_hint
    if ref.live_patch_blocked:
        manifest_diff = ch.manifest_diff(workload, new_spec, ref.container)
        hint = hint or repository_hint(workload, diagnosis.changes, ref.container)
    else:
        ops = ch.build_json_patch(pod_spec, new_spec, ref.container, ch.pod_spec_pointer(workload.get("kind", "")),
                                  resource_version=meta.get("resourceVersion"))
        if meta.get("generation") is not None:
            # generation moves only when someone edits the spec (not on status updates): see rebase().
            ops.insert(1, {"op": "test", "path": "/metadata/generation", "value": meta["generation"]})
    created = now()
    return Proposal(
        id=uuid.uuid4().hex[:12],
        cluster=cluster,
        workload=bound_to(ref, meta.get("resourceVersion"), meta.get("uid") or ref.uid, hint),
        cause=diagnosis.cause,
        title=diagnosis.title,
        changes=ch.with_live_before(pod_spec, ref.container, list(diagnosis.changes)),
        command_before=argv(pod_spec, ref.container),
        command_after=argv(new_spec, ref.container),
        container_before=before,
        json_patch=ops,
        manifest_diff=manifest_diff,
        created_at=created,
        expires_at=created + ttl,
    ).sealed()


def bound_to(ref: WorkloadRef, resource_version: str | None, uid: str | None,
             repository_hint: str | None) -> WorkloadRef:
    """`ref` bound to the object state a proposal is computed from (validated, not copied blindly)."""
    return WorkloadRef.model_validate({**ref.model_dump(), "resource_version": resource_version, "uid": uid,
                                       "repository_hint": repository_hint})


def at_version(ref: WorkloadRef, resource_version: str | None) -> WorkloadRef:
    """`ref` at another resourceVersion of the same object (after a patch)."""
    return WorkloadRef.model_validate({**ref.model_dump(), "resource_version": resource_version})


def dry_run_checked(proposal: Proposal, ok: bool, message: str) -> Proposal:
    """The proposal with the dry run's answer (not part of its sealed content: the digest stays)."""
    return revised(proposal, dry_run_ok=ok, dry_run_message=message)


def not_allowed(proposal: Proposal, current: dict[str, Any], playbooks: Any = None) -> str | None:
    """Why this proposal must not be applied, or None.

    Proposals live in the cluster (the incident object), where someone with write access could
    edit them. So before patching: every change must be one the cause's playbook declares, and
    the stored JSON Patch must be exactly the patch those changes make to this workload.
    """
    from bot.diagnosis.playbooks import default_playbooks

    book = next((b for b in (playbooks or default_playbooks()) if b.id == proposal.cause), None)
    if book is None:
        return f"no playbook {proposal.cause!r} declares this change"
    extra = [f"{c.kind} {c.name}" for c in proposal.changes if not book.allows(c)]
    if extra:
        return f"playbook {book.id} does not allow changing {', '.join(extra)}"
    pod_spec = ch.pod_spec_of(current)
    expected = ch.build_json_patch(pod_spec, ch.apply_changes(pod_spec, proposal.workload.container, proposal.changes),
                                   proposal.workload.container, ch.pod_spec_pointer(current.get("kind", "")),
                                   resource_version=None)
    stored = [op for op in proposal.json_patch if not op["path"].startswith("/metadata/")]
    expected = [op for op in expected if not op["path"].startswith("/metadata/")]
    if not redacted_equal(stored, expected):
        return "the stored patch does not match the proposal's changes"
    return None


def conflict_with(proposal: Proposal, current: dict[str, Any]) -> str | None:
    """What changed in the target container (or volumes) since the proposal; None if nothing did."""
    now_fields = ch.fields_of(ch.pod_spec_of(current), proposal.workload.container)
    if redacted_equal(proposal.container_before, now_fields):
        return None  # the stored copy may be redacted: *** stands for the secret it hid
    return ch.describe_field_diff(DEFAULT_REDACTOR.fields(proposal.container_before),
                                  DEFAULT_REDACTOR.fields(now_fields))


def rebase(ops: list[dict[str, Any]], current: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The patch conditional on the current resourceVersion, if only status/metadata moved since.

    A crash-looping Deployment's status changes all the time, and each status write bumps the
    resourceVersion. The container fields are tested op by op and the generation (bumped only by
    spec edits) is tested too, so moving the resourceVersion test to the version we just read keeps
    the patch exactly as conditional. Returns None when the generation moved: a spec edit.
    """
    meta = current.get("metadata") or {}
    out = [dict(op) for op in ops]
    for op in out:
        if op["op"] == "test" and op["path"] == "/metadata/generation" and op["value"] != meta.get("generation"):
            return None
    for op in out:
        if op["op"] == "test" and op["path"] == "/metadata/resourceVersion":
            op["value"] = meta.get("resourceVersion")
    return unmasked_ops(out, current)


def read_audit(workload: dict[str, Any]) -> list[dict[str, Any]]:
    text = ((workload.get("metadata") or {}).get("annotations") or {}).get(AUDIT_ANNOTATION)
    if not text:
        return []
    try:
        records = json.loads(text)
    except json.JSONDecodeError:
        return []
    if isinstance(records, dict):  # tolerate a single record written by hand
        records = [records]
    return [r for r in records if isinstance(r, dict)]


def bounded(records: list[dict[str, Any]]) -> str:
    """JSON for the annotation: the newest records, at most AUDIT_MAX_RECORDS and AUDIT_MAX_BYTES."""
    kept = records[-AUDIT_MAX_RECORDS:]
    text = json.dumps(kept, separators=(",", ":"))
    while len(text.encode()) > AUDIT_MAX_BYTES and len(kept) > 1:
        kept = kept[1:]
        text = json.dumps(kept, separators=(",", ":"))
    return text


def audit_record(action: str, proposal_id: str, actor: str, cause: str | None, container: str,
                 before: dict[str, Any], after: dict[str, Any], message: str = "",
                 digest: str = "") -> dict[str, Any]:
    fields = [f for f in ch.CONTAINER_FIELDS + ch.POD_FIELDS
              if f in ALWAYS_RECORDED or before.get(f) != after.get(f)]
    return {
        "id": proposal_id,
        "action": action,
        "who": actor,
        "when": now().strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cause": cause,
        "container": container,
        "fields": fields,
        "before": {f: before.get(f) for f in fields},
        "after": {f: after.get(f) for f in fields},
        **({"message": message} if message else {}),
        **({"digest": digest} if digest else {}),
    }


def fields_changed_by(record: dict[str, Any]) -> list[str]:
    """The recorded fields whose value actually changed (command/args are recorded regardless)."""
    return [f for f in record["fields"] if record["before"].get(f) != record["after"].get(f)]


def audit_ops(workload: dict[str, Any], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """JSON Patch ops that write the audit annotation (creating metadata.annotations if needed)."""
    text = bounded([redacted_record(r) for r in records])
    annotations = (workload.get("metadata") or {}).get("annotations")
    if annotations is None:
        return [{"op": "add", "path": "/metadata/annotations", "value": {AUDIT_ANNOTATION: text}}]
    return [{"op": "add", "path": "/metadata/annotations/" + AUDIT_ANNOTATION.replace("~", "~0").replace("/", "~1"),
             "value": text}]


def change_ops(proposal: Proposal, current: dict[str, Any], actor: str) -> tuple[list[dict[str, Any]], dict]:
    """The proposal's patch plus its audit record, for the workload as it is now."""
    pod_spec = ch.pod_spec_of(current)
    after_spec = ch.apply_changes(pod_spec, proposal.workload.container, proposal.changes)
    record = audit_record("change", proposal.id, actor, proposal.cause, proposal.workload.container,
                          ch.fields_of(pod_spec, proposal.workload.container),
                          ch.fields_of(after_spec, proposal.workload.container), digest=proposal.digest)
    return audit_ops(current, read_audit(current) + [record]), record


def applied_record(proposal: Proposal, current: dict[str, Any]) -> dict[str, Any] | None:
    """The audit record this proposal left on the workload, if it was applied (whatever the API
    answered at the time: a patch can commit and still answer 5xx or time out)."""
    for record in reversed(read_audit(current)):
        if record.get("action") == "change" and record.get("id") == proposal.id and (
                not proposal.digest or record.get("digest") == proposal.digest):
            return record
    return None


def matches_recorded(actual: Any, recorded: Any) -> bool:
    """`actual` is what we recorded, give or take the fields the API server defaults on write
    (a probe's timeoutSeconds/successThreshold, httpGet.scheme): mappings may have extra keys;
    lists must have the same items in the same order (an added env var or arg is an edit)."""
    if isinstance(recorded, str) and has_mask(recorded):
        return masked_match(recorded, actual)  # the record holds *** where a secret was
    if isinstance(recorded, dict):
        return isinstance(actual, dict) and all(k in actual and matches_recorded(actual[k], v)
                                                for k, v in recorded.items())
    if isinstance(recorded, list):
        return (isinstance(actual, list) and len(actual) == len(recorded)
                and all(matches_recorded(a, r) for a, r in zip(actual, recorded)))
    return actual == recorded or (actual is not None and recorded is not None and str(actual) == str(recorded))


class RollbackRefused(Exception):
    """No change to roll back, or the workload was edited since that change (a conflict)."""

    def __init__(self, message: str, conflict: bool = False):
        super().__init__(message)
        self.conflict = conflict


def rollback_target(records: list[dict[str, Any]], change_id: str | None = None,
                    digest: str | None = None) -> int:
    """The index in `records` of the change a rollback undoes: the change record with `change_id`
    (and `digest`, when given: the proposal that incident applied), else the newest change not yet
    rolled back. RollbackRefused when there is none, or that change was rolled back already."""
    changes = [i for i, r in enumerate(records) if r.get("action") == "change"]
    if change_id is None:
        found = next((i for i in reversed(changes) if not records[i].get("rolled_back_by")), None)
        if found is None:
            raise RollbackRefused(f"no change by vllm-oncall left to roll back on this workload "
                                  f"(annotation {AUDIT_ANNOTATION})")
        return found
    found = next((i for i in reversed(changes) if records[i].get("id") == change_id
                  and (not digest or records[i].get("digest") == digest)), None)
    if found is None:
        raise RollbackRefused(f"this workload carries no record of change {change_id} (annotation "
                              f"{AUDIT_ANNOTATION}): it is not the workload that change was applied to, or its "
                              "record is gone; nothing to roll back here")
    if records[found].get("rolled_back_by"):
        raise RollbackRefused(f"change {change_id} was rolled back already (by {records[found]['rolled_back_by']})")
    return found


def later_overlap(records: list[dict[str, Any]], index: int) -> str | None:
    """Why undoing records[index] would also undo a later change: a later change (not rolled
    back) on the same container that changed one of the same fields. None if none did."""
    target = records[index]
    mine = set(fields_changed_by(target))
    for later in records[index + 1:]:
        if later.get("action") != "change" or later.get("rolled_back_by") or \
                later.get("container") != target.get("container"):
            continue
        shared = sorted(mine & set(fields_changed_by(later)))
        if shared:
            return (f"change {later.get('id')} ({later.get('cause')}, by {later.get('who')}) changed "
                    f"{', '.join(shared)} after change {target.get('id')}; undoing {target.get('id')} would undo "
                    f"it too. Roll back {later.get('id')} first, or change it by hand")
    return None


def rollback_ops(current: dict[str, Any], actor: str, change_id: str | None = None,
                 digest: str | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Ops restoring the fields recorded by one change (`change_id`, else the last change not yet
    rolled back), guarded by `test` ops on the values that change introduced: refused when a later
    change or anyone else touched those fields since."""
    records = read_audit(current)
    index = rollback_target(records, change_id, digest)
    target = records[index]
    overlap = later_overlap(records, index)
    if overlap:
        raise RollbackRefused(overlap, conflict=True)
    container = target["container"]
    pod_spec = ch.pod_spec_of(current)
    now_fields = ch.fields_of(pod_spec, container)
    drifted = {f: now_fields.get(f) for f in target["fields"]
               if not matches_recorded(now_fields.get(f), target["after"].get(f))}
    if drifted:
        expected = {f: target["after"].get(f) for f in drifted}
        raise RollbackRefused("the workload was edited after change " + target["id"] + "; refusing to overwrite:\n"
                              + ch.describe_field_diff(expected, drifted), conflict=True)
    restored = json.loads(json.dumps(pod_spec))
    c = restored["containers"][ch.container_index(restored, container)]
    for f in target["fields"]:
        holder = restored if f in ch.POD_FIELDS else c
        value = restored_value(target, f, now_fields.get(f))
        if value is None:
            holder.pop(f, None)
        else:
            holder[f] = value
    meta = current.get("metadata") or {}
    # build_json_patch tests each field it changes against its current value: the value the change
    # introduced (checked just above), so the write applies only while that is still so.
    ops = ch.build_json_patch(pod_spec, restored, container, ch.pod_spec_pointer(current.get("kind", "")),
                              resource_version=meta.get("resourceVersion"))
    record = audit_record("rollback", uuid.uuid4().hex[:12], actor, target.get("cause"), container,
                          now_fields, ch.fields_of(restored, container), message=f"rollback of {target['id']}")
    target["rolled_back_by"] = record["id"]
    return ops + audit_ops(current, records + [record]), record


def rolled_back_record(current: dict[str, Any], rollback_id: str) -> dict[str, Any] | None:
    """The rollback record `rollback_id` on the workload, if that rollback landed (read back after
    an ambiguous answer)."""
    return next((r for r in read_audit(current) if r.get("action") == "rollback" and r.get("id") == rollback_id),
                None)


def event_for(workload: dict[str, Any], reason: str, message: str) -> dict[str, Any]:
    """A core/v1 Event on the workload (what `kubectl describe deployment` shows)."""
    meta = workload.get("metadata") or {}
    stamp = now().strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta.get('name', 'workload')}.{uuid.uuid4().hex[:16]}",
                     "namespace": meta.get("namespace")},
        "involvedObject": {"kind": workload.get("kind"), "apiVersion": workload.get("apiVersion", "apps/v1"),
                           "namespace": meta.get("namespace"), "name": meta.get("name"), "uid": meta.get("uid"),
                           "resourceVersion": meta.get("resourceVersion")},
        "reason": reason,
        "message": DEFAULT_REDACTOR.text(message)[:1000],
        "type": "Normal",
        "source": {"component": "vllm-oncall"},
        "reportingComponent": "vllm-oncall",
        "reportingInstance": "vllm-oncall",
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def describe_record(record: dict[str, Any]) -> str:
    """One line for the Event and the chat: secret values in the command lines masked."""
    redact = DEFAULT_REDACTOR.args
    before = " ".join(redact((record["before"].get("command") or []) + (record["before"].get("args") or [])))
    after = " ".join(redact((record["after"].get("command") or []) + (record["after"].get("args") or [])))
    others = [f for f in record["fields"] if f not in ALWAYS_RECORDED]
    text = f"{record['action']} {record['id']} by {record['who']} ({record.get('cause')}): {before!r} -> {after!r}"
    return text + (f"; also changed {', '.join(others)}" if others else "")


# ---- redaction of what is stored and shown; exactness of what is applied -----------------
#
# The incident object and the audit annotation hold redacted copies: a secret value (the value
# of --api-key, HF_TOKEN, a URL password) is *** there. What is *applied* is never a redacted
# copy: every masked value in a patch, or in a record a rollback restores, is taken back from
# the live object, where it must still be (a change never touches a secret value), and the apply
# or rollback is refused when it cannot be found exactly.


class Unrestorable(ValueError):
    """A masked value whose secret cannot be found, exactly once, in the live object."""


def redacted_equal(stored: Any, live: Any) -> bool:
    """Whether `stored` (a patch, a container spec, a field value, possibly redacted) is `live`
    with secrets masked: equal, each *** standing for the text it hid. Use it wherever a stored
    proposal is compared with one re-derived from the live workload."""
    return masked_match(stored, live)


def redact_patch(ops: list[dict[str, Any]], redactor: Redactor = DEFAULT_REDACTOR) -> list[dict[str, Any]]:
    """A JSON Patch with the values of container fields redacted (for storage and display only)."""
    out = []
    for op in ops:
        op = dict(op)
        if "value" in op and not op["path"].startswith("/metadata/"):
            op["value"] = redactor.field(op["path"].rsplit("/", 1)[-1], op["value"])
        out.append(op)
    return out


def redact_proposal(proposal: Proposal, redactor: Redactor = DEFAULT_REDACTOR, **update: Any) -> Proposal:
    """The proposal as it may be stored and shown: command lines, the container as diagnosed,
    the patch's values and the manifest diff redacted. `changes` stay exact: playbooks change
    only flags that are not secrets, and the apply path re-derives the patch from them. `update`:
    other fields set in the same validation (redaction reads none of them)."""
    return revised(
        proposal, **update,
        command_before=redactor.args(proposal.command_before),
        command_after=redactor.args(proposal.command_after),
        container_before=redactor.fields(proposal.container_before),
        json_patch=redact_patch(proposal.json_patch, redactor),
        manifest_diff=redactor.text(proposal.manifest_diff) if proposal.manifest_diff else proposal.manifest_diff,
        dry_run_message=redactor.text(proposal.dry_run_message) if proposal.dry_run_message else None,
    )


def redacted_record(record: dict[str, Any], redactor: Redactor = DEFAULT_REDACTOR) -> dict[str, Any]:
    """An audit record as the annotation keeps it: before/after values redacted (see
    restored_value for how a rollback still restores the exact previous spec)."""
    out = dict(record)
    for side in ("before", "after"):
        if isinstance(record.get(side), dict):
            out[side] = redactor.fields(record[side])
    if isinstance(record.get("message"), str):
        out["message"] = redactor.text(record["message"])
    return out


def unmask(stored: Any, live: Any) -> Any:
    """`stored` with every masked part taken back from `live`, the value it was derived from
    (the same value, or one a change edited elsewhere). Raises Unrestorable when a masked value
    cannot be matched to exactly one live value."""
    if not has_mask(stored):
        return stored
    if masked_match(stored, live):
        return live
    if isinstance(stored, dict) and isinstance(live, dict) and stored.keys() <= live.keys():
        return {k: unmask(v, live[k]) for k, v in stored.items()}
    if isinstance(stored, list) and isinstance(live, list):
        return _unmask_list(stored, live)
    raise Unrestorable("a masked value is not in the live object")


def _unmask_list(stored: list[Any], live: list[Any]) -> list[Any]:
    """Each masked item is the one live item it matches; when several match (a bare *** after
    --api-key matches any argument), the one after the same preceding item."""
    out: list[Any] = []
    used: set[int] = set()
    for i, item in enumerate(stored):
        if not has_mask(item):
            out.append(item)
            continue
        found = [j for j, v in enumerate(live) if j not in used and masked_match(item, v)]
        if len(found) > 1:
            found = [j for j in found if (i == 0 and j == 0) or
                     (i > 0 and j > 0 and masked_match(stored[i - 1], live[j - 1]))]
        if len(found) != 1:
            raise Unrestorable(f"the masked item {item!r} matches {len(found)} live items, not exactly one")
        used.add(found[0])
        out.append(live[found[0]])
    return out


def _pointer_get(obj: Any, path: str) -> Any:
    for part in path.lstrip("/").split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    return obj


def unmasked_ops(ops: list[dict[str, Any]], current: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The exact patch for a stored (possibly redacted) one: a masked `test` value is the live
    value it stands for, a masked `add`/`replace` value is restored from the live value at its
    path. None when a masked value cannot be restored exactly (treat it as an edit: refuse)."""
    out = []
    for op in ops:
        if "value" in op and has_mask(op["value"]):
            try:
                live = _pointer_get(current, op["path"])
                if op["op"] == "test" and not masked_match(op["value"], live):
                    return None  # edited since: the test would fail anyway
                op = {**op, "value": live if op["op"] == "test" else unmask(op["value"], live)}
            except (KeyError, IndexError, ValueError, TypeError):  # Unrestorable is a ValueError
                return None
        out.append(op)
    return out


def exact_patch(proposal: Proposal, current: dict[str, Any]) -> list[dict[str, Any]] | None:
    """What Approve applies: the patch re-derived from the live workload and the proposal's
    changes, with the stored metadata tests moved to the current resourceVersion (see rebase),
    if the stored patch (possibly redacted) is that patch; else None (refuse: edited)."""
    pod_spec = ch.pod_spec_of(current)
    derived = ch.build_json_patch(pod_spec, ch.apply_changes(pod_spec, proposal.workload.container,
                                                             proposal.changes),
                                  proposal.workload.container, ch.pod_spec_pointer(current.get("kind", "")))
    stored = [op for op in proposal.json_patch if not op["path"].startswith("/metadata/")]
    if not redacted_equal(stored, derived):
        return None
    meta_ops = rebase([op for op in proposal.json_patch if op["path"].startswith("/metadata/")], current)
    if meta_ops is None:
        return None
    return meta_ops + derived  # the metadata tests first, as make_proposal writes them


def restored_value(record: dict[str, Any], field: str, live: Any) -> Any:
    """The value a rollback writes back for `field`: the recorded `before`, with any masked
    secret taken from the live value (the change did not touch it). RollbackRefused when it
    cannot be restored exactly, so a rollback never writes *** into a spec."""
    value = record["before"].get(field)
    try:
        return unmask(value, live)
    except Unrestorable as exc:
        raise RollbackRefused(f"change {record.get('id')} recorded {field} with a secret masked, and the "
                              f"secret is no longer in the workload ({exc}); restore {field} by hand") from None
