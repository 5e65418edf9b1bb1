"""A local HTTP server that speaks the Kubernetes API wire format, for the endpoints the bot uses.

It is not a kube-apiserver; it is the smallest honest stand-in for one (a real apiserver
cannot run on the test machines):
- JSON paths and verbs as the real API: /api/v1/..., /apis/{group}/{version}/..., GET (get/list),
  POST (create), PUT (update), PATCH (json-patch, merge-patch), DELETE.
- Status objects for every error, with the real reasons and messages (NotFound, AlreadyExists,
  Conflict, Invalid, Forbidden, ServiceUnavailable, TooManyRequests).
- resourceVersion from one global counter, bumped on every write; metadata.generation bumped
  when a spec changes; a write that carries a stale resourceVersion gets 409.
- JSON Patch applied by the `jsonpatch` library (RFC 6902); a failed `test` op gets 422.
- dryRun=All validates (kubernetes-validate schemas plus the volumeMount-name rule) and
  persists nothing.
- pods/log with container, previous, tailLines and limitBytes (tailLines first, as the kubelet).
- label selectors (=, ==, !=, in, notin, exists, !exists) and field selectors (dotted equality).
- faults to inject per (verb, resource): 403, N x 5xx, 429 with Retry-After; and around a write's
  commit (`fail_commit`, `chaos`): fail before or after it commits, answer slowly, drop the connection.
- `calls`: every (verb, apiGroup, resource) the client made, for the RBAC test; `requests`: each
  ordinary (not watch, not proxy) request as it arrived (method, target, headers, body).
- `on_write`: a hook called after each persisted write of a workload, so a test can play the
  part of the Deployment controller (create a new ReplicaSet and pod) deterministically.
- watch (`?watch=1` on lists) and the pod proxy subresource: tests/kubeapi/streams.py.
- API discovery (/version, /api, /apis, /api/v1, /apis/{group}/{version}) for the real kubectl:
  tests/kubeapi/discovery.py; the paths asked for are in `discovery_calls`, not `calls`.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonpatch
import jsonschema
from kubernetes_validate import utils as schemas
from referencing import Registry, Resource
from standin_http import QuietHandler, StandInServer

from kubeapi import discovery
from kubeapi.streams import StreamingMixin, Streams

# (apiGroup, resource) -> (kind, apiVersion, namespaced)
RESOURCES: dict[tuple[str, str], tuple[str, str, bool]] = {
    ("", "pods"): ("Pod", "v1", True),
    ("", "events"): ("Event", "v1", True),
    ("", "nodes"): ("Node", "v1", False),
    ("", "namespaces"): ("Namespace", "v1", False),
    ("apps", "replicasets"): ("ReplicaSet", "apps/v1", True),
    ("apps", "deployments"): ("Deployment", "apps/v1", True),
    ("apps", "statefulsets"): ("StatefulSet", "apps/v1", True),
    ("oncall.vllm.ai", "vllmincidents"): ("VLLMIncident", "oncall.vllm.ai/v1", True),
    ("authorization.k8s.io", "selfsubjectaccessreviews"): ("SelfSubjectAccessReview", "authorization.k8s.io/v1", False),
}
KIND_TO_RESOURCE = {kind: key for key, (kind, _, _) in RESOURCES.items()}
VALIDATED_KINDS = {"Pod", "ReplicaSet", "Deployment", "StatefulSet", "Node"}
SCHEMA_VERSION = "1.33"


@functools.cache
def _schema_validator(kind: str, api_version: str) -> jsonschema.protocols.Validator:
    """kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)'s validator, built once per
    kind: that function reads and parses the schema files (the definitions are megabytes) at
    every call, which made a validated write cost milliseconds, under the stand-in's lock."""
    version = [v for v in schemas.all_versions() if schemas.major_minor(v) <= SCHEMA_VERSION][-1]
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = schemas.schema_contents(f"{folder}/{kind.lower()}-{group}.json", SCHEMA_VERSION)
    definitions = schemas.schema_contents(f"{folder}/_definitions.json", SCHEMA_VERSION)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.details, self.headers = details or {}, headers or {}

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


@dataclass
class Fault:
    verb: str  # get | list | create | update | patch | delete | "*"
    resource: str  # "deployments", "pods/log", ... or "*"
    code: int
    times: int | None = None  # None = every time
    retry_after: str | None = None
    message: str = ""


# ---- commit faults: fail before or after the write commits, answer slowly, drop the connection ----

class DropConnection(Exception):
    """Close the connection without an answer (the client sees a reset / a truncated response)."""


@dataclass
class CommitFault:
    """A fault around the write itself. when: "before" (nothing is written) or "after" (the write
    commits, then the answer is lost). kind: an HTTP code (500, 503, 504), "drop" (connection
    closed, no answer) or "slow" (the answer comes `seconds` late)."""

    verb: str
    resource: str
    when: str  # before | after
    kind: int | str
    times: int | None = None
    seconds: float = 0.0


class Chaos:
    """Seeded random commit faults on the matching requests: `rate` of them fail, half before
    and half after the commit, as 500, 503 or a dropped connection."""

    def __init__(self, rate: float, seed: int, verbs: set[str], resources: set[str]):
        import random

        self.rate, self.rng, self.verbs, self.resources = rate, random.Random(seed), verbs, resources
        self.injected: list[tuple[str, str, str, int | str]] = []

    def pick(self, verb: str, resource: str) -> CommitFault | None:
        if verb not in self.verbs or resource not in self.resources or self.rng.random() >= self.rate:
            return None
        fault = CommitFault(verb, resource, self.rng.choice(["before", "after"]),
                            self.rng.choice([500, 503, "drop"]), times=1)
        self.injected.append((verb, resource, fault.when, fault.kind))
        return fault


@dataclass
class Call:
    verb: str
    group: str
    resource: str  # with subresource: pods/log
    namespace: str
    name: str
    query: dict[str, str] = field(default_factory=dict)
    dry_run: bool = False
    code: int | None = None  # the HTTP status it was answered with
    committed: bool = False  # a commit fault hid that this write had committed


@dataclass(frozen=True)
class Request:
    """One HTTP request as the server received it: what the client really sent."""

    method: str
    target: str  # the path and the query string, as sent
    headers: dict[str, str]  # names as sent
    body: bytes


# ---- selectors ------------------------------------------------------------------------------

def _split_selector(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def label_selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for req in _split_selector(selector):
        if " notin " in req or " in " in req:
            key, op, values = req.partition(" notin ") if " notin " in req else req.partition(" in ")
            wanted = {v.strip() for v in values.strip().strip("()").split(",")}
            present = labels.get(key.strip()) in wanted
            if (op.strip() == "in") != present:
                return False
        elif "!=" in req:
            key, _, value = req.partition("!=")
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in req:
            key, _, value = req.replace("==", "=").partition("=")
            if labels.get(key.strip()) != value.strip():
                return False
        elif req.startswith("!"):
            if req[1:] in labels:
                return False
        elif req not in labels:
            return False
    return True


def _dotted(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def field_selector_matches(selector: str, obj: dict[str, Any]) -> bool:
    for req in _split_selector(selector):
        if "!=" in req:
            key, _, value = req.partition("!=")
            if str(_dotted(obj, key) or "") == value:
                return False
        else:
            key, _, value = req.replace("==", "=").partition("=")
            if str(_dotted(obj, key) or "") != value:
                return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# ---- the store ------------------------------------------------------------------------------

class FakeKube(Streams):
    """The API's state plus the HTTP server that serves it. Start with `start()`."""

    def __init__(self, user: str = "system:serviceaccount:vllm-oncall:vllm-oncall",
                 sleep: Callable[[float], object] | None = None):
        self.user = user
        self._stopped = threading.Event()
        # How a "slow" commit fault waits before answering: real time by default (a client's socket
        # timeout is real), cut short by stop(); a test of the bot's own clock passes one that
        # advances that clock instead.
        self.sleep: Callable[[float], object] = sleep or self._stopped.wait
        self.lock = threading.RLock()
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}  # (group, resource, ns, name)
        self.logs: dict[tuple[str, str, str, bool], str] = {}  # (ns, pod, container, previous)
        self.faults: list[Fault] = []
        self.commit_faults: list[CommitFault] = []
        self.chaos: Chaos | None = None
        self.calls: list[Call] = []
        self.requests: list[Request] = []
        self.list_pages: list[str] = []  # the kind of every list page served (limit/continue)
        self.discovery_calls: list[str] = []  # discovery paths asked for (kubectl), kept out of `calls`
        self.resource_version = 1000
        self.on_write: Callable[[FakeKube, dict[str, Any], dict[str, Any] | None], None] | None = None
        self.http: StandInServer | None = None
        self._init_streams()  # watch, pod proxy (tests/kubeapi/streams.py)

    # -- lifecycle
    def start(self) -> FakeKube:
        fake = self

        class Handler(StreamingMixin, _Handler):
            kube = fake

        self.http = StandInServer(Handler, name="fake-kube-api").start()
        return self

    def stop(self) -> None:
        self._stopped.set()  # held answers are given now
        if self.http is not None:
            self.http.stop()

    @property
    def url(self) -> str:
        assert self.http is not None, "start() the server first"
        return self.http.url

    def api_client(self):
        """A real kubernetes.client.ApiClient pointed at this server."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.url
        cfg.retries = False  # the bot's own tenacity policy does the retrying, not urllib3
        return client.ApiClient(cfg)

    # -- test helpers
    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store an object as if it had been created (kind decides the resource)."""
        group, resource = KIND_TO_RESOURCE[obj["kind"]]
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        ns = meta.get("namespace", "") if RESOURCES[(group, resource)][2] else ""
        with self.lock:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", now_iso())
            meta.setdefault("generation", 1)
            meta["resourceVersion"] = self._next_rv()
            self.objects[(group, resource, ns, meta["name"])] = obj
        return copy.deepcopy(obj)

    def get(self, kind: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        group, resource = KIND_TO_RESOURCE[kind]
        ns = namespace if RESOURCES[(group, resource)][2] else ""
        with self.lock:
            obj = self.objects.get((group, resource, ns, name))
            return copy.deepcopy(obj) if obj else None

    def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        group, resource = KIND_TO_RESOURCE[kind]
        with self.lock:
            return [copy.deepcopy(o) for (g, r, ns, _), o in self.objects.items()
                    if (g, r) == (group, resource) and (namespace is None or ns == namespace)]

    def delete(self, kind: str, name: str, namespace: str = "") -> None:
        group, resource = KIND_TO_RESOURCE[kind]
        with self.lock:
            self.objects.pop((group, resource, namespace, name), None)

    def edit(self, kind: str, name: str, namespace: str, mutate: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Someone else edits the object (kubectl edit): mutate, bump resourceVersion/generation."""
        group, resource = KIND_TO_RESOURCE[kind]
        with self.lock:
            key = (group, resource, namespace, name)
            old = self.objects[key]
            new = copy.deepcopy(old)
            mutate(new)
            self._stamp_write(old, new)
            self.objects[key] = new
            return copy.deepcopy(new)

    def set_log(self, namespace: str, pod: str, container: str, text: str, previous: bool = True) -> None:
        with self.lock:
            self.logs[(namespace, pod, container, previous)] = text

    def fail(self, verb: str, resource: str, code: int, times: int | None = None,
             retry_after: str | None = None, message: str = "") -> None:
        with self.lock:
            self.faults.append(Fault(verb, resource, code, times, retry_after, message))

    def fail_commit(self, verb: str, resource: str, when: str, kind: int | str, times: int | None = 1,
                    seconds: float = 0.0) -> None:
        """A commit fault (see CommitFault): e.g. fail_commit("patch", "deployments", "after", 500)."""
        with self.lock:
            self.commit_faults.append(CommitFault(verb, resource, when, kind, times, seconds))

    def _commit_fault(self, verb: str, resource: str, when: str) -> CommitFault | None:
        with self.lock:
            for f in self.commit_faults:
                if f.when == when and f.verb in (verb, "*") and f.resource in (resource, "*") and \
                        (f.times is None or f.times > 0):
                    if f.times is not None:
                        f.times -= 1
                    return f
            if when == "before" and self.chaos is not None:
                picked = self.chaos.pick(verb, resource)
                if picked is not None and picked.when == "after":
                    self.commit_faults.append(picked)  # fires once this request has committed
                    return None
                return picked
        return None

    def _commit_failure(self, fault: CommitFault) -> Exception:
        if fault.kind == "slow":
            self.sleep(fault.seconds)
            return _NoFault()
        if fault.kind == "drop":
            return DropConnection()
        return ApiError(int(fault.kind), "InternalError" if fault.kind == 500 else "ServiceUnavailable",
                        "the server is currently unable to handle the request")

    def called(self) -> set[tuple[str, str, str]]:
        """The distinct (verb, apiGroup, resource) the client has called."""
        with self.lock:
            return {(c.verb, c.group, c.resource) for c in self.calls}

    # -- internals
    def _next_rv(self) -> str:
        self.resource_version += 1
        return str(self.resource_version)

    def _stamp_write(self, old: dict[str, Any] | None, new: dict[str, Any]) -> None:
        meta = new.setdefault("metadata", {})
        meta["resourceVersion"] = self._next_rv()
        if old is not None and old.get("spec") != new.get("spec"):
            meta["generation"] = int((old.get("metadata") or {}).get("generation") or 1) + 1

    def _fault_for(self, verb: str, resource: str) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.verb in (verb, "*") and f.resource in (resource, "*") and (f.times is None or f.times > 0):
                    if f.times is not None:
                        f.times -= 1
                    return f
        return None

    def _validate(self, obj: dict[str, Any], kind: str, name: str) -> None:
        if kind not in VALIDATED_KINDS:
            return
        causes: list[dict[str, str]] = []
        try:
            _schema_validator(kind, str(obj.get("apiVersion") or "")).validate(obj)
        except jsonschema.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path) if hasattr(exc, "path") else ""
            causes.append({"reason": "FieldValueInvalid", "message": str(exc).splitlines()[0], "field": where})
        pod_spec = obj.get("spec") if kind == "Pod" else ((obj.get("spec") or {}).get("template") or {}).get("spec")
        prefix = "spec" if kind == "Pod" else "spec.template.spec"
        if isinstance(pod_spec, dict):
            volumes = {v.get("name") for v in pod_spec.get("volumes") or []}
            for i, c in enumerate(pod_spec.get("containers") or []):
                for j, m in enumerate(c.get("volumeMounts") or []):
                    if m.get("name") not in volumes:
                        causes.append({"reason": "FieldValueNotFound", "message": f'Not found: "{m.get("name")}"',
                                       "field": f"{prefix}.containers[{i}].volumeMounts[{j}].name"})
        if causes:
            group = KIND_TO_RESOURCE[kind][0]
            text = "; ".join(f"{c['field']}: {c['message']}" for c in causes)
            raise ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {text}',
                           {"name": name, "group": group, "kind": kind, "causes": causes})

    def handle(self, method: str, path: str, query: dict[str, str], body: bytes,
               content_type: str) -> tuple[int, Any, dict[str, str]]:
        """One request -> (status code, JSON body or text, extra headers)."""
        doc = discovery.answer(path, RESOURCES, self.url) if method == "GET" else None
        if doc is not None or path.startswith("/openapi"):
            with self.lock:
                self.discovery_calls.append(path)
            if doc is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return 200, doc, {}
        group, version, namespace, resource, name, sub = _parse_path(path)
        full_resource = f"{resource}/{sub}" if sub else resource
        if method == "GET":
            verb = "watch" if query.get("watch") in ("true", "1") else ("get" if name else "list")
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, method.lower())
        dry_run = query.get("dryRun") == "All"
        call = Call(verb, group, full_resource, namespace, name, dict(query), dry_run)
        with self.lock:
            self.calls.append(call)
        writes = verb in ("create", "update", "patch", "delete") and not dry_run
        before = self._commit_fault(verb, full_resource, "before") if writes else None
        if before is not None:
            failure = self._commit_failure(before)
            if not isinstance(failure, _NoFault):
                call.code = getattr(failure, "code", 0)
                raise failure
        try:
            answer = self._answer(verb, group, namespace, resource, name, sub, query, body, content_type)
        except ApiError as err:
            call.code = err.code
            raise
        after = self._commit_fault(verb, full_resource, "after") if writes else None
        if after is not None:
            failure = self._commit_failure(after)
            if not isinstance(failure, _NoFault):
                call.code = getattr(failure, "code", 0)
                call.committed = True
                raise failure
        call.code = answer[0]
        return answer

    def _answer(self, verb: str, group: str, namespace: str, resource: str, name: str, sub: str,
                query: dict[str, str], body: bytes, content_type: str) -> tuple[int, Any, dict[str, str]]:
        full_resource = f"{resource}/{sub}" if sub else resource
        dry_run = query.get("dryRun") == "All"
        if (group, resource) not in RESOURCES:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        fault = self._fault_for(verb, full_resource)
        if fault:
            raise self._fault_error(fault, verb, group, full_resource, namespace, name)
        kind, api_version, namespaced = RESOURCES[(group, resource)]
        ns = namespace if namespaced else ""
        plural = f"{resource}.{group}" if group else resource
        if sub == "log":
            return 200, self._log(ns, name, query), {"Content-Type": "text/plain"}
        if sub:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        with self.lock:
            if verb == "list":
                items = []
                for (g, r, ons, _), obj in sorted(self.objects.items()):
                    if (g, r) != (group, resource) or (namespace and ons != namespace):
                        continue
                    labels = (obj.get("metadata") or {}).get("labels") or {}
                    if query.get("labelSelector") and not label_selector_matches(query["labelSelector"], labels):
                        continue
                    if query.get("fieldSelector") and not field_selector_matches(query["fieldSelector"], obj):
                        continue
                    items.append(obj)
                page = self._page(kind, api_version, items, query)
                page["items"] = [self._list_item(group, obj) for obj in page["items"]]  # copies of this page only
                return 200, page, {}
            if verb == "create":
                return self._create(group, resource, kind, api_version, ns, plural, body, dry_run)
            if verb == "watch":
                raise ApiError(405, "MethodNotAllowed", "watch is not served by this stand-in")
            key = (group, resource, ns, name)
            current = self.objects.get(key)
            if current is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found',
                               {"name": name, "group": group, "kind": resource})
            if verb == "get":
                return 200, copy.deepcopy(current), {}
            if verb == "delete":
                if not dry_run:
                    del self.objects[key]
                return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                             "details": {"name": name, "group": group, "kind": resource}}, {}
            if verb == "update":
                new = _json_body(body)
                sent_rv = (new.get("metadata") or {}).get("resourceVersion")
                if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
                    raise _conflict(plural, name)
                new.setdefault("metadata", {})
                for keep in ("uid", "creationTimestamp", "generation"):
                    if keep in current["metadata"]:
                        new["metadata"].setdefault(keep, current["metadata"][keep])
            else:  # patch
                new = self._patched(current, body, content_type, plural, name)
            new.setdefault("kind", kind)
            new.setdefault("apiVersion", api_version)
            if (new.get("metadata") or {}).get("name") != name:
                raise ApiError(422, "Invalid", f'{kind} "{name}" is invalid: metadata.name: Invalid value: '
                               f'field is immutable', {"name": name, "group": group, "kind": kind})
            self._validate(new, kind, name)
            self._stamp_write(current, new)
            if dry_run:
                new["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                self.resource_version -= 1  # a dry run consumes nothing
                return 200, new, {}
            self.objects[key] = new
        if self.on_write and group == "apps":
            self.on_write(self, copy.deepcopy(new), copy.deepcopy(current))
        return 200, copy.deepcopy(new), {}

    def _patched(self, current: dict[str, Any], body: bytes, content_type: str, plural: str,
                 name: str) -> dict[str, Any]:
        patch = _json_body(body)
        ctype = content_type.split(";")[0].strip()
        if ctype == "application/json-patch+json":
            if not isinstance(patch, list):
                raise ApiError(400, "BadRequest", "json patch must be a list of operations")
            try:
                new = jsonpatch.apply_patch(current, patch, in_place=False)
            except jsonpatch.JsonPatchTestFailed as exc:
                # what kube-apiserver answers when a `test` op does not hold
                raise ApiError(422, "Invalid", f'{plural} "{name}" is invalid: the server rejected our request '
                               f'due to an error in our request: testing value failed: {exc}',
                               {"name": name, "kind": current.get("kind", ""),
                                "causes": [{"reason": "FieldValueInvalid", "message": str(exc)}]}) from None
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise ApiError(422, "Invalid", f'{plural} "{name}" is invalid: {exc}',
                               {"name": name, "kind": current.get("kind", "")}) from None
        elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if not isinstance(patch, dict):
                raise ApiError(400, "BadRequest", "merge patch must be a JSON object")
            new = merge_patch(current, patch)
        else:
            raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                           "accepted media types include: application/json-patch+json, "
                           "application/merge-patch+json, application/apply-patch+yaml")
        sent_rv = (new.get("metadata") or {}).get("resourceVersion")
        if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
            raise _conflict(plural, name)
        return new

    def _create(self, group: str, resource: str, kind: str, api_version: str, ns: str, plural: str,
                body: bytes, dry_run: bool) -> tuple[int, Any, dict[str, str]]:
        obj = _json_body(body)
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the body of the request is not an object")
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name")
        if not name:
            raise ApiError(422, "Invalid", f'{kind} "" is invalid: metadata.name: Required value: name or '
                           f'generateName is required', {"kind": kind})
        if resource == "selfsubjectaccessreviews":
            obj["status"] = {"allowed": True}
            return 201, obj, {}
        if ns:
            meta["namespace"] = ns
        key = (group, resource, ns, name)
        if key in self.objects:
            raise ApiError(409, "AlreadyExists", f'{plural} "{name}" already exists',
                           {"name": name, "group": group, "kind": resource})
        obj.setdefault("kind", kind)
        obj.setdefault("apiVersion", api_version)
        self._validate(obj, kind, name)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_iso()
        meta["generation"] = 1
        meta.pop("resourceVersion", None)
        if dry_run:
            return 201, obj, {}
        meta["resourceVersion"] = self._next_rv()
        self.objects[key] = obj
        return 201, copy.deepcopy(obj), {}

    @staticmethod
    def _list_item(group: str, obj: dict[str, Any]) -> dict[str, Any]:
        item = copy.deepcopy(obj)
        if group in ("", "apps"):  # built-in lists omit kind/apiVersion on items
            item.pop("kind", None)
            item.pop("apiVersion", None)
        return item

    def _page(self, kind: str, api_version: str, items: list[dict], query: dict[str, str]) -> dict:
        """One page of a list (`limit`, `continue`), as kube-apiserver pages: the token names where
        the next page starts; every page carries the list's resourceVersion."""
        self.list_pages.append(kind)
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or 0)
        page = items[start:start + limit] if limit > 0 else items[start:]
        meta: dict[str, Any] = {"resourceVersion": str(self.resource_version)}
        if limit > 0 and start + limit < len(items):
            meta["continue"] = str(start + limit)
            meta["remainingItemCount"] = len(items) - start - limit
        return {"kind": f"{kind}List", "apiVersion": api_version, "metadata": meta, "items": page}

    def _log(self, ns: str, pod_name: str, query: dict[str, str]) -> str:
        with self.lock:
            pod = self.objects.get(("", "pods", ns, pod_name))
            if pod is None:
                raise ApiError(404, "NotFound", f'pods "{pod_name}" not found',
                               {"name": pod_name, "kind": "pods"})
            names = [c["name"] for c in (pod.get("spec") or {}).get("containers") or []]
            container = query.get("container")
            if not container:
                if len(names) != 1:
                    raise ApiError(400, "BadRequest", f"a container name must be specified for pod {pod_name}, "
                                   f"choose one of: [{' '.join(names)}]")
                container = names[0]
            if container not in names:
                raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {pod_name}")
            previous = query.get("previous") in ("true", "1")
            text = self.logs.get((ns, pod_name, container, previous))
        if text is None:
            if previous:
                raise ApiError(400, "BadRequest",
                               f'previous terminated container "{container}" in pod "{pod_name}" not found')
            text = ""
        if query.get("tailLines"):
            lines = text.splitlines(keepends=True)
            n = int(query["tailLines"])
            text = "".join(lines[-n:]) if n > 0 else ""
        if query.get("limitBytes"):
            raw = text.encode("utf-8")[: int(query["limitBytes"])]
            text = raw.decode("utf-8", errors="ignore")
        return text

    def _fault_error(self, fault: Fault, verb: str, group: str, resource: str, ns: str, name: str) -> ApiError:
        base, _, sub = resource.partition("/")
        if fault.code == 403:
            what = f'{base}.{group}' if group else base
            target = f'{what} "{name}"' if name else what
            sub_text = f'resource "{base}/{sub}"' if sub else f'resource "{base}"'
            scope = f' in the namespace "{ns}"' if ns else " at the cluster scope"
            msg = fault.message or (f'{target} is forbidden: User "{self.user}" cannot {verb} {sub_text} '
                                    f'in API group "{group}"{scope}')
            return ApiError(403, "Forbidden", msg, {"name": name, "group": group, "kind": base})
        if fault.code == 429:
            headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
            return ApiError(429, "TooManyRequests", fault.message or "Too many requests, please try again later.",
                            {"retryAfterSeconds": int(float(fault.retry_after or 1))}, headers)
        if fault.code == 409:
            return _conflict(f"{base}.{group}" if group else base, name)
        reasons = {500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout", 502: "BadGateway"}
        return ApiError(fault.code, reasons.get(fault.code, "InternalError"),
                        fault.message or "the server is currently unable to handle the request")


class _NoFault(Exception):
    """A slow answer that is then given normally."""


def _conflict(plural: str, name: str) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {plural} "{name}": the object has been '
                    f'modified; please apply your changes to the latest version and try again',
                    {"name": name, "kind": plural.split(".")[0]})


def _json_body(body: bytes) -> Any:
    try:
        return json.loads(body or b"null")
    except json.JSONDecodeError as exc:
        raise ApiError(400, "BadRequest", f"the body of the request was not valid JSON: {exc}") from None


def _parse_path(path: str) -> tuple[str, str, str, str, str, str]:
    """-> (group, version, namespace, resource, name, subresource)."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    return group, version, namespace, resource, name, sub


class _Handler(QuietHandler):
    kube: FakeKube
    protocol_version = "HTTP/1.1"

    def _serve(self) -> None:
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        body = self.body()
        with self.kube.lock:
            self.kube.requests.append(Request(self.command, self.path, dict(self.headers.items()), body))
        try:
            code, payload, headers = self.kube.handle(self.command, split.path, query, body,
                                                      self.headers.get("Content-Type") or "application/json")
        except ApiError as err:
            code, payload, headers = err.code, err.status(), err.headers
        except DropConnection:
            self.close_connection = True
            self.connection.shutdown(2)  # no answer at all
            return
        if isinstance(payload, str):
            data = payload.encode("utf-8")
            headers = {"Content-Type": "text/plain; charset=utf-8", **headers}
        else:
            data = json.dumps(payload).encode("utf-8")
        content_type = headers.pop("Content-Type", "application/json")
        self.reply(code, data, content_type, headers)  # a client killed meanwhile (kill -9 tests) is no error here

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve
