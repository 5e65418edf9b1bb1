"""Manifest files on the command line: what `fix` can rewrite, and how `demo` shows a change.

Each check answers with one line a person can act on (not valid YAML, a Helm template, no
Deployment/StatefulSet in it), before the rewrite is attempted.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml

from bot.diagnosis import cmdline
from bot.diagnosis.models import Change
from bot.remedy.changes import WORKLOAD_KINDS, container_index

# Set by the API server, not by whoever wrote the manifest: left out of diffs.
SERVER_METADATA = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "selfLink")
SERVER_ANNOTATIONS = ("deployment.kubernetes.io/revision", "kubectl.kubernetes.io/last-applied-configuration")
TEMPLATE_MARK = re.compile(r"\{\{-?\s*[.$\w(\"]")  # `{{ .Values.x }}`, `{{- include ...`, `{{ $x }}`


class ManifestError(ValueError):
    """A manifest file `fix` cannot rewrite; the message names the file."""


def workload_document(path: Path, text: str) -> dict[str, Any]:
    """The first Deployment/StatefulSet in the file (the one rewrite_manifest changes)."""
    if TEMPLATE_MARK.search(text):
        raise ManifestError(f"{path}: a Helm/Go template ({{{{ ... }}}}), not a manifest: change the chart's "
                            "values instead, or render it first (helm template ... > manifest.yaml)")
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ManifestError(f"{path}: not valid YAML{where}: {problem}") from None
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") in WORKLOAD_KINDS:
            return doc
    kinds = sorted({str(d.get("kind")) for d in docs if isinstance(d, dict) and d.get("kind")})
    found = f"it holds {', '.join(kinds)}" if kinds else "it holds no Kubernetes object"
    raise ManifestError(f"{path}: no {' or '.join(WORKLOAD_KINDS)} to rewrite ({found})")


def current_value(workload: dict[str, Any], container: str | None, change: Change) -> tuple[bool, str | None]:
    """(known, value) of what `change` edits in the manifest; known is False for kinds not compared."""
    spec = ((workload.get("spec") or {}).get("template") or {}).get("spec") or {}
    c = spec["containers"][container_index(spec, container)]
    if change.kind == "flag":
        return True, cmdline.parse(_strs(c.get("command")), _strs(c.get("args"))).get(change.name)
    if change.kind == "env":
        entry = next((e for e in c.get("env") or [] if e.get("name") == change.name), None)
        if entry is not None and "valueFrom" in entry:
            return False, None
        return True, None if entry is None else str(entry.get("value", ""))
    if change.kind == "resources":
        section, _, name = change.name.partition(".")
        value = ((c.get("resources") or {}).get(section) or {}).get(name)
        return True, None if value is None else str(value)
    return False, None  # volumes and probes: the change replaces the whole field


def _strs(items: Any) -> list[str] | None:
    return [str(i) for i in items] if isinstance(items, list) else None


def differences(workload: dict[str, Any], container: str | None, changes: list[Change]) -> list[str]:
    """One line per change whose current value in the manifest is not the one the crashed pod ran."""
    out = []
    for change in changes:
        known, value = current_value(workload, container, change)
        if known and value != change.before:
            out.append(f"{change.kind} {change.name} is {_shown(value)} in the manifest but "
                       f"{_shown(change.before)} in the crashed pod; the proposal sets it to "
                       f"{_shown(change.after)}: check that still fits this file")
    return out


def _shown(value: str | None) -> str:
    return "(not set)" if value is None else repr(value)


def server_fields_removed(text: str) -> str:
    """The YAML without status and the metadata the API server sets, in one canonical layout."""
    docs = []
    for doc in yaml.safe_load_all(text):
        if not isinstance(doc, dict):
            continue
        doc.pop("status", None)
        meta = doc.get("metadata") or {}
        for key in SERVER_METADATA:
            meta.pop(key, None)
        annotations = meta.get("annotations") or {}
        for key in SERVER_ANNOTATIONS:
            annotations.pop(key, None)
        if "annotations" in meta and not annotations:
            del meta["annotations"]
        docs.append(doc)
    return yaml.safe_dump_all(docs, sort_keys=False, width=1000)


def unified_diff(before: str, after: str, before_name: str, after_name: str) -> str:
    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                 before_name, after_name)
    return "".join(lines) or "(no difference)\n"
