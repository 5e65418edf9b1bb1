"""Turn a diagnosis' Changes into a new pod spec, an RFC 6902 JSON Patch, or an edited manifest file.

Pure: no network, no cluster. Used by the live cluster (bot/kube/live.py), the files-only
cluster (bot/kube/local.py) and `vllm-oncall fix`.

What each Change kind means here (the diagnosis core produces them):
- flag: `name` in --dash-form; `after` the new value, "true" to add a boolean flag, None to
  remove it. Rewritten by bot.cmdline.apply_flag_changes, which keeps the manifest's spelling.
- env: `name` the variable; `after` its value, None to remove it.
- volume: `name` the mount path ("/dev/shm"); `after` the emptyDir sizeLimit ("16Gi"; "" for
  no limit); the volume is an emptyDir with medium Memory plus its volumeMount. None removes both.
- resources: `name` "limits.memory", "limits.nvidia.com/gpu", "requests.memory", ...; `after`
  a quantity, None to remove. A GPU limit drags its request along (the API requires them equal)
  and a memory request above a lowered memory limit is lowered to it (the API rejects it otherwise).
- probe: `name` "startupProbe" with `after` a probe as a YAML/JSON mapping, or a time budget
  ("600", "600s", "15m") from which a probe is built with the container's liveness (or
  readiness) handler, or httpGet /health on the serving port; or a dotted field such as
  "livenessProbe.failureThreshold" with a number. None removes the probe.
"""

from __future__ import annotations

import copy
import difflib
import io
import json
import math
import re
from typing import Any

import yaml

from bot.diagnosis import cmdline
from bot.diagnosis.evidence import parse_quantity
from bot.diagnosis.models import Change

# The container fields a fix may touch, and the one pod-level field (volumes for /dev/shm).
CONTAINER_FIELDS = ("command", "args", "env", "volumeMounts", "resources",
                    "startupProbe", "livenessProbe", "readinessProbe")
POD_FIELDS = ("volumes",)
DEFAULT_SERVING_PORT = 8000
PROBE_PERIOD_SECONDS = 10


class ChangeError(ValueError):
    """A change that cannot be made to this container (unknown kind or name, bad value)."""


# ---- pod spec edits -------------------------------------------------------------------------

def container_index(pod_spec: dict[str, Any], container: str | None) -> int:
    """Index of the named container; with no name, the first vLLM-looking one."""
    containers = pod_spec.get("containers") or []
    if container:
        for i, c in enumerate(containers):
            if c.get("name") == container:
                return i
        raise ChangeError(f"no container named {container!r} (have: {[c.get('name') for c in containers]})")
    for i, c in enumerate(containers):
        words = [c.get("image", "")] + [str(w) for w in (c.get("command") or []) + (c.get("args") or [])]
        if any("vllm" in w or "api_server" in w for w in words):
            return i
    if not containers:
        raise ChangeError("the pod spec has no containers")
    return 0


def apply_changes(pod_spec: dict[str, Any], container: str | None, changes: list[Change]) -> dict[str, Any]:
    """A new pod spec with every change made to the target container (the input is not modified)."""
    spec = copy.deepcopy(pod_spec)
    c = spec["containers"][container_index(spec, container)]
    flag_changes = [ch for ch in changes if ch.kind == "flag"]
    if flag_changes:
        parsed = cmdline.parse(_strs(c.get("command")), _strs(c.get("args")))
        command, args = cmdline.apply_flag_changes(parsed, flag_changes)
        _set_or_drop(c, "command", command)
        _set_or_drop(c, "args", args)
    for ch in changes:
        if ch.kind == "env":
            _change_env(c, ch)
        elif ch.kind == "volume":
            _change_volume(spec, c, ch)
        elif ch.kind == "resources":
            _change_resources(c, ch)
        elif ch.kind == "probe":
            _change_probe(c, ch)
        elif ch.kind != "flag":
            raise ChangeError(f"unknown change kind {ch.kind!r}")
    return spec


def _strs(items: Any) -> list[str] | None:
    return [str(x) for x in items] if items is not None else None


def _set_or_drop(mapping: dict[str, Any], key: str, value: Any) -> None:
    if value is None:
        mapping.pop(key, None)
    else:
        mapping[key] = value


def _change_env(c: dict[str, Any], ch: Change) -> None:
    env = [e for e in c.get("env") or []]
    same = [i for i, e in enumerate(env) if e.get("name") == ch.name]
    if ch.after is None:
        env = [e for e in env if e.get("name") != ch.name]
    elif same:
        keep = same[-1]  # the last definition is the one the kubelet uses
        env[keep] = {"name": ch.name, "value": ch.after}
        env = [e for i, e in enumerate(env) if i == keep or e.get("name") != ch.name]
    else:
        env.append({"name": ch.name, "value": ch.after})
    _set_or_drop(c, "env", env or None)


def _change_volume(spec: dict[str, Any], c: dict[str, Any], ch: Change) -> None:
    mount_path = ch.name or "/dev/shm"
    mounts = list(c.get("volumeMounts") or [])
    volumes = list(spec.get("volumes") or [])
    mount = next((m for m in mounts if m.get("mountPath") == mount_path), None)
    if ch.after is None:
        if mount is not None:
            mounts.remove(mount)
            still_used = any(m.get("name") == mount["name"] for other in spec["containers"]
                             for m in other.get("volumeMounts") or [] if other is not c) or \
                any(m.get("name") == mount["name"] for m in mounts)
            if not still_used:
                volumes = [v for v in volumes if v.get("name") != mount["name"]]
        _set_or_drop(c, "volumeMounts", mounts or None)
        _set_or_drop(spec, "volumes", volumes or None)
        return
    empty_dir: dict[str, Any] = {"medium": "Memory"}
    if ch.after:
        if parse_quantity(ch.after) is None:
            raise ChangeError(f"{ch.after!r} is not a Kubernetes quantity for the {mount_path} sizeLimit")
        empty_dir["sizeLimit"] = ch.after
    if mount is None:
        taken = {v.get("name") for v in volumes}
        name, n = "dshm", 2
        while name in taken:
            name, n = f"dshm-{n}", n + 1
        mounts.append({"name": name, "mountPath": mount_path})
        volumes.append({"name": name, "emptyDir": empty_dir})
    else:
        volume = next((v for v in volumes if v.get("name") == mount["name"]), None)
        if volume is None:
            volumes.append({"name": mount["name"], "emptyDir": empty_dir})
        else:
            # Replace whatever source it had (a hostPath, a small emptyDir) by a memory emptyDir.
            volumes[volumes.index(volume)] = {"name": mount["name"], "emptyDir": empty_dir}
    c["volumeMounts"] = mounts
    spec["volumes"] = volumes


def _change_resources(c: dict[str, Any], ch: Change) -> None:
    section, _, key = ch.name.partition(".")
    if section not in ("limits", "requests") or not key:
        raise ChangeError(f"resources change {ch.name!r}: expected limits.<name> or requests.<name>")
    if ch.after is not None and parse_quantity(ch.after) is None:
        raise ChangeError(f"{ch.after!r} is not a Kubernetes quantity for {ch.name}")
    resources = copy.deepcopy(c.get("resources") or {})
    block = dict(resources.get(section) or {})
    _set_or_drop(block, key, ch.after)
    _set_or_drop(resources, section, block or None)
    if section == "limits" and ch.after is not None:
        requests = dict(resources.get("requests") or {})
        if key == "nvidia.com/gpu" and key in requests:
            requests[key] = ch.after  # extended resources: request must equal limit
        elif key in requests:
            req, lim = parse_quantity(requests[key]), parse_quantity(ch.after)
            if req is not None and lim is not None and req > lim:
                requests[key] = ch.after  # a request above its limit is rejected by the API
        if requests:
            resources["requests"] = requests
    _set_or_drop(c, "resources", resources or None)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*$")


def _change_probe(c: dict[str, Any], ch: Change) -> None:
    probe_name, _, field = ch.name.partition(".")
    if probe_name not in ("startupProbe", "livenessProbe", "readinessProbe"):
        raise ChangeError(f"probe change {ch.name!r}: expected startupProbe, livenessProbe or readinessProbe")
    if field:
        probe = copy.deepcopy(c.get(probe_name) or {})
        if not probe:
            raise ChangeError(f"the container has no {probe_name} whose {field} could change")
        if ch.after is None:
            probe.pop(field, None)
        else:
            probe[field] = int(ch.after) if ch.after.lstrip("-").isdigit() else ch.after
        c[probe_name] = probe
        return
    if ch.after is None:
        c.pop(probe_name, None)
        return
    c[probe_name] = build_probe(c, ch.after)


def build_probe(c: dict[str, Any], after: str) -> dict[str, Any]:
    """A probe from a mapping (YAML/JSON text) or from a startup time budget."""
    m = _DURATION.match(after)
    if m is None:
        try:
            probe = yaml.safe_load(after)
        except yaml.YAMLError as exc:
            raise ChangeError(f"probe {after!r} is neither a time budget nor a YAML mapping: {exc}") from None
        if not isinstance(probe, dict):
            raise ChangeError(f"probe {after!r} is neither a time budget nor a YAML mapping")
        return probe
    seconds = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    handler_keys = ("httpGet", "tcpSocket", "exec", "grpc")
    source = c.get("livenessProbe") or c.get("readinessProbe") or {}
    handler = {k: copy.deepcopy(v) for k, v in source.items() if k in handler_keys}
    if not handler:
        ports = [p.get("containerPort") for p in c.get("ports") or [] if p.get("containerPort")]
        handler = {"httpGet": {"path": "/health", "port": ports[0] if ports else DEFAULT_SERVING_PORT}}
    return {**handler, "periodSeconds": PROBE_PERIOD_SECONDS,
            "failureThreshold": max(1, math.ceil(seconds / PROBE_PERIOD_SECONDS))}


# ---- the live value a change replaces -------------------------------------------------------

def with_live_before(pod_spec: dict[str, Any], container: str | None, changes: list[Change]) -> list[Change]:
    """`changes` with each `before` read from this (live) pod spec where it sets the field.

    The diagnosis read its values from the crashed pod, which may be older than the workload
    (someone already lowered --max-model-len from 32768 to 30000): the approver must see what
    the patch replaces, and the patch's `test` ops are built from the same live spec. A flag the
    live spec does not set keeps the diagnosis' value (the effective default it computed from).
    """
    c = pod_spec["containers"][container_index(pod_spec, container)]
    out = []
    for change in changes:
        live = _live_value(c, change)
        before = change.before if live is _UNREAD else live
        out.append(Change(kind=change.kind, name=change.name, before=before, after=change.after))
    return out


_UNREAD = object()  # a field this reader does not compare (a whole probe, a volume's source)


def _live_value(c: dict[str, Any], change: Change) -> Any:
    if change.kind == "flag":
        value = cmdline.parse(_strs(c.get("command")), _strs(c.get("args"))).get(change.name)
        return _UNREAD if value is None else value
    if change.kind == "env":
        named = [e for e in c.get("env") or [] if e.get("name") == change.name]
        return None if not named else (named[-1].get("value") if "value" in named[-1] else _UNREAD)
    if change.kind == "resources":
        section, _, key = change.name.partition(".")
        value = ((c.get("resources") or {}).get(section) or {}).get(key)
        return None if value is None else str(value)
    if change.kind == "probe" and "." in change.name:
        probe_name, _, field = change.name.partition(".")
        value = (c.get(probe_name) or {}).get(field)
        return None if value is None else str(value)
    return _UNREAD


# ---- field snapshots, diffs and the JSON Patch ---------------------------------------------

def fields_of(pod_spec: dict[str, Any], container: str | None) -> dict[str, Any]:
    """The fields a fix may change, as they are now (absent fields omitted)."""
    c = pod_spec["containers"][container_index(pod_spec, container)]
    out = {f: copy.deepcopy(c[f]) for f in CONTAINER_FIELDS if f in c}
    out.update({f: copy.deepcopy(pod_spec[f]) for f in POD_FIELDS if f in pod_spec})
    return out


def changed_fields(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Names of the fields that differ between two `fields_of` snapshots, in a stable order."""
    return [f for f in CONTAINER_FIELDS + POD_FIELDS if before.get(f) != after.get(f)]


def describe_field_diff(before: dict[str, Any], after: dict[str, Any]) -> str:
    """A short human diff of two `fields_of` snapshots (what someone else changed)."""
    lines: list[str] = []
    for f in changed_fields(before, after):
        lines.append(f"{f}: {_compact(before.get(f))} -> {_compact(after.get(f))}")
    return "\n".join(lines)


def _compact(value: Any) -> str:
    if value is None:
        return "(absent)"
    text = json.dumps(value, separators=(",", ":"))
    return text if len(text) <= 300 else text[:297] + "..."


def build_json_patch(before_spec: dict[str, Any], after_spec: dict[str, Any], container: str | None,
                     base: str = "/spec/template/spec", resource_version: str | None = None) -> list[dict[str, Any]]:
    """RFC 6902 ops turning before_spec into after_spec on the target container.

    Every field that changes is first tested against its diagnosed value, the container is
    tested by name at its index (so a reordered container list cannot be patched blindly), and
    the resourceVersion is tested when given: the patch applies only to the state we diagnosed.
    """
    index = container_index(before_spec, container)
    name = before_spec["containers"][index]["name"]
    before = fields_of(before_spec, name)
    after = fields_of(after_spec, name)
    ops: list[dict[str, Any]] = []
    if resource_version is not None:
        ops.append({"op": "test", "path": "/metadata/resourceVersion", "value": resource_version})
    ops.append({"op": "test", "path": f"{base}/containers/{index}/name", "value": name})
    for f in changed_fields(before, after):
        path = f"{base}/{f}" if f in POD_FIELDS else f"{base}/containers/{index}/{f}"
        if f in before:
            ops.append({"op": "test", "path": path, "value": before[f]})
        if f not in after:
            ops.append({"op": "remove", "path": path})
        else:
            ops.append({"op": "replace" if f in before else "add", "path": path, "value": after[f]})
    return ops


def pod_spec_of(workload: dict[str, Any]) -> dict[str, Any]:
    """The pod spec inside a Pod, or inside a Deployment/StatefulSet/Job/ReplicaSet template."""
    if workload.get("kind") == "Pod":
        return workload.get("spec") or {}
    return ((workload.get("spec") or {}).get("template") or {}).get("spec") or {}


def pod_spec_pointer(kind: str) -> str:
    return "/spec" if kind == "Pod" else "/spec/template/spec"


def manifest_diff(workload: dict[str, Any], after_spec: dict[str, Any], container: str | None) -> str:
    """A unified diff of the container (and volumes) before and after, for a manual or Git change."""
    name = pod_spec_of(workload)["containers"][container_index(pod_spec_of(workload), container)]["name"]
    before = fields_of(pod_spec_of(workload), name)
    after = fields_of(after_spec, name)
    kind = workload.get("kind", "Deployment")
    meta = workload.get("metadata") or {}
    label = f"{kind}/{meta.get('name', '?')} container {name}"
    a = yaml.safe_dump(before, sort_keys=False, width=1000).splitlines()
    b = yaml.safe_dump(after, sort_keys=False, width=1000).splitlines()
    return "\n".join(difflib.unified_diff(a, b, f"{label} (now)", f"{label} (proposed)", lineterm=""))


# ---- manifest files (ruamel.yaml round trip) ------------------------------------------------

WORKLOAD_KINDS = ("Deployment", "StatefulSet")


def rewrite_manifest(text: str, changes: list[Change], container: str | None = None,
                     workload_name: str | None = None) -> tuple[str, list[str]]:
    """The manifest text with the changes made to its Deployment/StatefulSet, and the fields changed.

    Only the workload's own document is re-emitted (other documents of the file stay byte for
    byte), through a ruamel.yaml round trip: comments, key order, quoting and block scalars (a `|`
    shell script stays a `|` script) are kept; only the values that change are touched.
    """
    parts = re.split(r"(?m)^(---[ \t]*(?:#.*)?\n)", text)  # [doc, sep, doc, sep, doc...]
    for i in range(0, len(parts), 2):
        try:
            doc = yaml.safe_load(parts[i])
        except yaml.YAMLError:
            continue
        if not isinstance(doc, dict) or doc.get("kind") not in WORKLOAD_KINDS:
            continue
        if workload_name is not None and (doc.get("metadata") or {}).get("name") != workload_name:
            continue
        new_doc, touched = _rewrite_document(parts[i], changes, container)
        parts[i] = new_doc
        return "".join(parts), touched
    raise ChangeError(f"no {' or '.join(WORKLOAD_KINDS)}"
                      f"{' named ' + workload_name if workload_name else ''} in the manifest")


def _rewrite_document(text: str, changes: list[Change], container: str | None) -> tuple[str, list[str]]:
    from ruamel.yaml import YAML

    ryaml = YAML()
    ryaml.preserve_quotes = True
    ryaml.width = 4096
    mapping, sequence, offset = _detect_indent(text)
    ryaml.indent(mapping=mapping, sequence=sequence, offset=offset)
    target = ryaml.load(text)
    live_spec = target["spec"]["template"]["spec"]
    plain_spec = json.loads(json.dumps(live_spec))
    name = plain_spec["containers"][container_index(plain_spec, container)]["name"]
    new_spec = apply_changes(plain_spec, name, changes)
    before, after = fields_of(plain_spec, name), fields_of(new_spec, name)
    touched = changed_fields(before, after)
    if not touched:
        return text, []
    live_container = live_spec["containers"][container_index(plain_spec, name)]
    for f in touched:
        holder = live_spec if f in POD_FIELDS else live_container
        if f not in after:
            del holder[f]
        elif f not in holder:
            holder[f] = after[f]
        else:
            holder[f] = _sync(holder[f], after[f])
    out = io.StringIO()
    ryaml.dump(target, out)
    return out.getvalue(), touched


def _sync(old: Any, new: Any) -> Any:
    """Make `old` (a ruamel node) equal to `new` (plain data) by editing it in place where it can."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.scalarstring import ScalarString

    if isinstance(old, CommentedMap) and isinstance(new, dict):
        for key in [k for k in old if k not in new]:
            del old[key]
        for key, value in new.items():
            old[key] = _sync(old[key], value) if key in old else value
        return old
    if isinstance(old, CommentedSeq) and isinstance(new, list):
        plain_old = [json.loads(json.dumps(x)) for x in old]
        matcher = difflib.SequenceMatcher(a=[json.dumps(x, sort_keys=True) for x in plain_old],
                                          b=[json.dumps(x, sort_keys=True) for x in new], autojunk=False)
        # Apply edits from the end so earlier indexes (and the comments on kept items) stay put.
        for tag, i1, i2, j1, j2 in reversed(matcher.get_opcodes()):
            if tag == "equal":
                continue
            if tag == "replace" and i2 - i1 == j2 - j1:
                for k in range(i2 - i1):
                    old[i1 + k] = _sync(old[i1 + k], new[j1 + k])
                continue
            for k in range(i2 - 1, i1 - 1, -1):
                del old[k]
            for k, value in enumerate(new[j1:j2]):
                old.insert(i1 + k, value)
        return old
    if isinstance(old, ScalarString) and isinstance(new, str):
        return type(old)(new)  # keep `|`, `>`, and quote style
    return new


def _detect_indent(text: str) -> tuple[int, int, int]:
    """(mapping indent, sequence indent, dash offset) as the file writes them."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    mapping = 2
    for prev, line in zip(lines, lines[1:]):
        if prev.rstrip().endswith(":") and not line.lstrip().startswith("- "):
            p, n = len(prev) - len(prev.lstrip()), len(line) - len(line.lstrip())
            if n > p:
                mapping = n - p
                break
    offset = 0
    for prev, line in zip(lines, lines[1:]):
        if prev.rstrip().endswith(":") and line.lstrip().startswith("- "):
            p = len(prev) - len(prev.lstrip()) - (2 if prev.lstrip().startswith("- ") else 0)
            if prev.lstrip().startswith("- "):
                p = len(prev) - len(prev.lstrip()) + 2
            offset = max(0, (len(line) - len(line.lstrip())) - p)
            break
    return mapping, offset + 2, offset
