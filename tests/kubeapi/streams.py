"""The Kubernetes API stand-in's long-lived answers: watch and the pod proxy subresource.

Kept apart from server.py (the request/response API) and mixed into it: `Streams` into FakeKube,
`StreamingMixin` into its request handler.

Watch (`GET <list path>?watch=1`), as kube-apiserver does it:
- a chunked stream of one JSON event per line: {"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR,
  "object": ...}; the object carries its resourceVersion (DELETED ones a fresh one);
- `resourceVersion` unset or "0": synthetic ADDED events for what exists, then changes; set: the
  changes after it, from the retained history;
- a resourceVersion older than the history (`compact()`, or `watch_history` events ago): HTTP 200
  with one ERROR event holding a 410 Expired Status, then the stream ends;
- `allowWatchBookmarks=true`: a BOOKMARK (kind, apiVersion, metadata.resourceVersion only) every
  `bookmark_seconds`;
- `timeoutSeconds`: the stream ends cleanly after that long;
- labelSelector / fieldSelector as on lists;
- `drop_watches()`: every open watch connection is cut without the final chunk (a dropped
  connection, as a restarting apiserver or a load balancer does);
- the request is recorded in `calls` as verb "watch", and faults for ("watch", resource) apply.

Pod proxy (`/api/v1/namespaces/{ns}/pods/{name}[:{port}]/proxy/{path}`): forwarded to the HTTP
server a test registered for the pod (`serve_pod`, e.g. a ScriptedVllm from
tests/kubeapi/vllmpod.py), method, body and query as sent; the backend's answer is returned as
is. No backend: 503 with the apiserver's "error trying to reach service" message. Recorded as
("get"|"create", "", "pods/proxy") for the RBAC test.
"""

from __future__ import annotations

import copy
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from standin_http import bound

WATCH_HISTORY = 10_000  # events kept for resuming watches; older resourceVersions get 410
BOOKMARK_SECONDS = 1.0


class _Evented(dict):
    """The object map; every persisted write becomes a watch event."""

    def __init__(self, kube: Streams):
        super().__init__()
        self.kube = kube

    def __setitem__(self, key: Any, obj: Any) -> None:
        with self.kube.lock:
            kind = "MODIFIED" if key in self else "ADDED"
            super().__setitem__(key, obj)
            self.kube._watch_event(kind, key, obj)

    def __delitem__(self, key: Any) -> None:
        with self.kube.lock:
            obj = copy.deepcopy(self[key])
            super().__delitem__(key)
            obj.setdefault("metadata", {})["resourceVersion"] = self.kube._next_rv()
            self.kube._watch_event("DELETED", key, obj)

    def pop(self, key: Any, *default: Any) -> Any:
        with self.kube.lock:
            if key in self:
                obj = self[key]
                del self[key]
                return obj
            if default:
                return default[0]
            raise KeyError(key)


class Streams:
    """Mixed into FakeKube: event history, open watches, pod backends."""

    lock: threading.RLock
    objects: dict
    resource_version: int

    def _init_streams(self) -> None:
        self.objects = _Evented(self)
        self.watch_history = WATCH_HISTORY
        self.bookmark_seconds = BOOKMARK_SECONDS
        self.events: list[tuple[int, str, tuple[str, str, str, str], dict[str, Any]]] = []
        self.compacted_rv = 0  # a watch from a resourceVersion below this gets 410
        self.watch_changed = threading.Condition(self.lock)
        self.open_watches: set[Any] = set()
        self.watches_opened = 0
        self.pod_backends: dict[tuple[str, str], str] = {}  # (ns, pod) -> http://127.0.0.1:port
        self.proxy_timeout = 30.0
        self.default_pod_backend: str | None = None  # for pods without their own (a rollout's new pod)

    def _next_rv(self) -> str:  # server.py's; declared for the type checker
        raise NotImplementedError

    # -- test helpers
    def compact(self) -> None:
        """Forget the event history (etcd compaction): any watch resuming from before now gets 410."""
        with self.lock:
            self.events.clear()
            self.compacted_rv = self.resource_version

    def drop_watches(self) -> int:
        """Cut every open watch connection; returns how many were open."""
        with self.lock:
            handlers = list(self.open_watches)
            for handler in handlers:
                handler.dropped = True
            self.watch_changed.notify_all()
        return len(handlers)

    def wait_for_watchers(self, n: int = 1, timeout: float = 10.0, opened_more_than: int = 0) -> bool:
        """True once `n` watches are open and more than `opened_more_than` were ever opened;
        `timeout` only bounds a failure (standin_http.bound)."""
        deadline = time.monotonic() + bound(timeout)
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.open_watches) >= n and self.watches_opened > opened_more_than:
                    return True
            time.sleep(0.01)
        return False

    def write_kubeconfig(self, path: Any) -> Any:
        """A kubeconfig naming this server (for `vllm-oncall serve` and kubectl); returns the path."""
        import yaml

        url = self.url  # type: ignore[attr-defined]
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
               "clusters": [{"name": "stand-in", "cluster": {"server": url}}],
               "users": [{"name": "bot", "user": {"token": "stand-in-token"}}],
               "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "bot"}}]}
        path.write_text(yaml.safe_dump(doc))
        return path

    def serve_pod(self, namespace: str, pod: str, url: str) -> None:
        """Requests through the pod proxy to this pod go to `url`."""
        with self.lock:
            self.pod_backends[(namespace, pod)] = url.rstrip("/")

    # -- events
    def _watch_event(self, kind: str, key: tuple[str, str, str, str], obj: dict[str, Any]) -> None:
        rv = int((obj.get("metadata") or {}).get("resourceVersion") or self.resource_version)
        self.events.append((rv, kind, key, copy.deepcopy(obj)))
        if len(self.events) > self.watch_history:
            dropped = self.events[: len(self.events) - self.watch_history]
            del self.events[: len(dropped)]
            self.compacted_rv = max(self.compacted_rv, dropped[-1][0])
        self.watch_changed.notify_all()

    def _matching(self, key: tuple[str, str, str, str], obj: dict[str, Any], group: str, resource: str,
                  namespace: str, query: dict[str, str]) -> bool:
        from kubeapi.server import field_selector_matches, label_selector_matches

        g, r, ns, _ = key
        if (g, r) != (group, resource) or (namespace and ns != namespace):
            return False
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if query.get("labelSelector") and not label_selector_matches(query["labelSelector"], labels):
            return False
        return not (query.get("fieldSelector") and not field_selector_matches(query["fieldSelector"], obj))

    # -- serving a watch
    def serve_watch(self, handler: Any, path: str, query: dict[str, str]) -> None:
        from kubeapi.server import RESOURCES, ApiError, Call, _parse_path

        try:
            group, _, namespace, resource, name, _sub = _parse_path(path)
            call = Call("watch", group, resource, namespace, name, dict(query))
            with self.lock:
                self.calls.append(call)  # type: ignore[attr-defined]
            if (group, resource) not in RESOURCES or name:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            fault = self._fault_for("watch", resource)  # type: ignore[attr-defined]
            if fault:
                raise self._fault_error(fault, "watch", group, resource, namespace, name)  # type: ignore[attr-defined]
        except ApiError as err:
            handler.send_plain(err.code, err.status(), err.headers)
            return
        call.code = 200
        handler.start_chunked()
        kind, api_version, _ = RESOURCES[(group, resource)]
        handler.dropped = False
        with self.lock:
            self.open_watches.add(handler)
            self.watches_opened += 1
        try:
            self._stream(handler, group, resource, namespace, query, kind, api_version)
        except OSError:
            pass  # the client went away
        finally:
            with self.lock:
                self.open_watches.discard(handler)

    def _stream(self, handler: Any, group: str, resource: str, namespace: str, query: dict[str, str],
                kind: str, api_version: str) -> None:
        started = time.monotonic()
        timeout = float(query.get("timeoutSeconds") or 1800)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        next_bookmark = started + self.bookmark_seconds
        sent: list[dict[str, Any]] = []
        with self.lock:
            rv_text = query.get("resourceVersion") or "0"
            if rv_text == "0":
                cursor = self.resource_version
                for key, obj in sorted(self.objects.items()):
                    if self._matching(key, obj, group, resource, namespace, query):
                        sent.append({"type": "ADDED", "object": _with_kind(obj, kind, api_version)})
            elif not rv_text.isdigit() or int(rv_text) < self.compacted_rv:
                expired = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                           "message": f"too old resource version: {rv_text} ({self.compacted_rv})",
                           "reason": "Expired", "code": 410}
                sent.append({"type": "ERROR", "object": expired})
                cursor = -1
            else:
                cursor = int(rv_text)
        for event in sent:
            handler.send_chunk(event)
        if cursor < 0:
            handler.end_chunks()
            return
        while True:
            with self.lock:
                pending = [(rv, t, k, o) for rv, t, k, o in self.events if rv > cursor]
                if not pending and not handler.dropped:
                    self.watch_changed.wait(0.1)
                    pending = [(rv, t, k, o) for rv, t, k, o in self.events if rv > cursor]
                dropped, current = handler.dropped, self.resource_version
            if dropped or getattr(handler.server, "socket", None) is None or handler.server.socket.fileno() < 0:
                handler.cut()
                return
            for rv, event_type, key, obj in pending:
                cursor = max(cursor, rv)
                if self._matching(key, obj, group, resource, namespace, query):
                    handler.send_chunk({"type": event_type, "object": _with_kind(obj, kind, api_version)})
            now = time.monotonic()
            if bookmarks and now >= next_bookmark:
                cursor = max(cursor, current)
                handler.send_chunk({"type": "BOOKMARK", "object": {
                    "kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": str(cursor)}}})
                next_bookmark = now + self.bookmark_seconds
            if now - started >= timeout:
                handler.end_chunks()
                return

    # -- the pod proxy
    def serve_proxy(self, handler: Any, method: str, path: str, query: str, body: bytes) -> None:
        from kubeapi.server import ApiError, Call

        parts = [unquote(p) for p in path.split("/") if p]
        # api v1 namespaces {ns} pods {name[:port]} proxy ...
        ns, target = parts[3], parts[5]
        pod_name = target.split(":")[0]
        rest = "/" + "/".join(parts[7:]) + (("?" + query) if query else "")
        verb = {"GET": "get", "POST": "create", "PUT": "update", "DELETE": "delete", "PATCH": "patch"}[method]
        call = Call(verb, "", "pods/proxy", ns, pod_name)
        with self.lock:
            self.calls.append(call)  # type: ignore[attr-defined]
            pod = self.objects.get(("", "pods", ns, pod_name))
            backend = self.pod_backends.get((ns, pod_name)) or self.default_pod_backend
        try:
            fault = self._fault_for(verb, "pods/proxy")  # type: ignore[attr-defined]
            if fault:
                raise self._fault_error(fault, verb, "", "pods/proxy", ns, pod_name)  # type: ignore[attr-defined]
            if pod is None:
                raise ApiError(404, "NotFound", f'pods "{pod_name}" not found', {"name": pod_name, "kind": "pods"})
            if backend is None:
                raise ApiError(503, "ServiceUnavailable", f"error trying to reach service: dial tcp "
                               f"{(pod.get('status') or {}).get('podIP') or '10.0.0.1'}:8000: connect: "
                               f"connection refused")
        except ApiError as err:
            call.code = err.code
            handler.send_plain(err.code, err.status(), err.headers)
            return
        request = urllib.request.Request(backend + rest, data=body if method != "GET" else None, method=method,
                                         headers={"Content-Type": handler.headers.get("Content-Type")
                                                  or "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.proxy_timeout) as answer:
                code, data, ctype = answer.status, answer.read(), answer.headers.get("Content-Type")
        except urllib.error.HTTPError as exc:
            code, data, ctype = exc.code, exc.read(), exc.headers.get("Content-Type")
        except (OSError, TimeoutError) as exc:
            err = ApiError(503, "ServiceUnavailable", f"error trying to reach service: {exc}")
            call.code = err.code
            handler.send_plain(err.code, err.status(), {})
            return
        call.code = code
        handler.send_bytes(code, data, ctype or "application/json")


def _with_kind(obj: dict[str, Any], kind: str, api_version: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out.setdefault("kind", kind)
    out.setdefault("apiVersion", api_version)
    return out


class StreamingMixin:
    """Mixed into the stand-in's request handler before its `_serve`: watches and proxied requests
    take this path, everything else the ordinary one."""

    kube: Any
    dropped = False

    def _serve_or_stream(self) -> None:
        split = urlsplit(self.path)  # type: ignore[attr-defined]
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        parts = [p for p in split.path.split("/") if p]
        if len(parts) >= 7 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods" \
                and parts[6] == "proxy":
            length = int(self.headers.get("Content-Length") or 0)  # type: ignore[attr-defined]
            body = self.rfile.read(length) if length else b""  # type: ignore[attr-defined]
            self.kube.serve_proxy(self, self.command, split.path, split.query, body)  # type: ignore[attr-defined]
            return
        if self.command == "GET" and query.get("watch") in ("true", "1"):  # type: ignore[attr-defined]
            self.kube.serve_watch(self, split.path, query)
            return
        super()._serve()  # type: ignore[misc]

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve_or_stream

    # -- writing
    def send_plain(self, code: int, doc: Any, headers: dict[str, str]) -> None:
        self.send_bytes(code, json.dumps(doc).encode(), "application/json", headers)

    def send_bytes(self, code: int, data: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)  # type: ignore[attr-defined]
        self.send_header("Content-Type", content_type)  # type: ignore[attr-defined]
        for key, value in (headers or {}).items():
            self.send_header(key, value)  # type: ignore[attr-defined]
        self.send_header("Content-Length", str(len(data)))  # type: ignore[attr-defined]
        self.end_headers()  # type: ignore[attr-defined]
        self.wfile.write(data)  # type: ignore[attr-defined]

    def start_chunked(self) -> None:
        self.send_response(200)  # type: ignore[attr-defined]
        self.send_header("Content-Type", "application/json")  # type: ignore[attr-defined]
        self.send_header("Transfer-Encoding", "chunked")  # type: ignore[attr-defined]
        self.end_headers()  # type: ignore[attr-defined]

    def send_chunk(self, event: dict[str, Any]) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))  # type: ignore[attr-defined]
        self.wfile.flush()  # type: ignore[attr-defined]

    def end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")  # type: ignore[attr-defined]
        self.wfile.flush()  # type: ignore[attr-defined]

    def cut(self) -> None:
        """Drop the connection mid-stream: no final chunk."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)  # type: ignore[attr-defined]
        except OSError:
            pass
