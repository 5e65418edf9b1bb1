"""The one place that calls the kubernetes client: raw JSON in and out, retries, clear errors.

Every failure leaves here as one of bot.kube.errors (KubeNotFound, KubeConflict, KubeInvalid,
KubeForbidden, KubeUnavailable, or KubeError for the rest), decided once in `KubeApi._call`;
the client's ApiException never reaches another module.

Objects are returned as plain dicts exactly as the API server sent them (camelCase, like
`kubectl get -o json`), so `test` operations in a JSON Patch compare against the server's own
representation and Evidence looks the same as a bundle read from disk.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import SSLError

from bot.kube.errors import (
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    KubeUnavailable,
    PreviousLogGone,
)
from bot.kube.retry import RetryPolicy, is_transient, retry_after_seconds, transient_reason
from bot.kube.wire import Transport

log = logging.getLogger("bot.kube")

CORE, APPS = ("api", "v1"), ("apis", "apps", "v1")  # where the core and apps/v1 groups are
# kind -> its resource in apps/v1 (in paths, messages and RBAC)
WORKLOAD_RESOURCES = {"Deployment": "deployments", "StatefulSet": "statefulsets", "ReplicaSet": "replicasets"}
JSON_PATCH = "application/json-patch+json"
# Connections kept open to the API server: at least one per thread that may call at once (up to
# 64 alert workers, VLLM_ONCALL_WORKERS; 8 HTTP handler threads; 2 rollout follow-ups; the sweep and
# the readiness check). Only what is used is ever opened.
POOL_CONNECTIONS = 80
PAGE_SIZE = 500  # items per list page (limit/continue), as kubectl asks
MERGE_PATCH = "application/merge-patch+json"


def api_client_from_environment(context: str | None = None, kubeconfig: str | None = None) -> client.ApiClient:
    """In-cluster service account when running in a pod, else kubeconfig (optionally a context)."""
    if context is None and kubeconfig is None:
        try:
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)
            return api_client_without_its_own_retries(cfg)
        except config.ConfigException:
            pass
    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    return api_client_without_its_own_retries(cfg)


def api_client_without_its_own_retries(cfg: client.Configuration) -> client.ApiClient:
    """An ApiClient whose urllib3 pool does not retry: RetryPolicy (bot/kube/retry.py) owns retries.

    Left at its default (retries=None), urllib3 retries connection errors three times on its own
    and, for a GET, sleeps a 429's or 503's whole Retry-After before retrying, however long: none
    of it capped, logged or counted. retries=False makes the first error reach RetryPolicy."""
    cfg.retries = False
    # The loaders' token-refresh hook runs before every request and assigns the host again, and
    # at each assignment the client re-resolves a proxy taken from the environment: a walk over
    # every environment variable per API call (86 us at 35 variables; a pod gets several per
    # Service in its namespace). The host is always the same one, so is its proxy: resolved
    # once, here, from the configuration as loaded (an explicit proxy-url stays as it is).
    cfg.proxy = cfg.proxy
    # The client keeps cpu_count * 5 connections (10 on 2 cores): with more threads calling at once
    # (16 alert workers by default), each call past the pool opened a connection of its own (a TCP,
    # in production a TLS, handshake) and closed it after one request, with a WARNING line each.
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize, POOL_CONNECTIONS)
    return client.ApiClient(cfg)


def _status_of(exc: ApiException) -> tuple[str, str | None]:
    """(message, reason) from the Status object the server sent, else from the raw answer."""
    try:
        body = json.loads(exc.body or "{}")
        return str(body.get("message") or exc.reason or exc.status), (body.get("reason") or exc.reason or None)
    except (json.JSONDecodeError, AttributeError):
        return str(exc.body or exc.reason or exc.status), (exc.reason or None)


def _is_status_object(exc: ApiException) -> bool:
    """kube-apiserver's errors are a JSON Status object (kind: Status)."""
    try:
        return json.loads(exc.body or "").get("kind") == "Status"
    except (ValueError, AttributeError, TypeError):
        return False


# kube-apiserver answers 422 when a JSON Patch `test` op does not hold; the message is
# json-patch's "testing value /path failed: test failed".
FAILED_TEST_OP = "testing value"
NOT_AN_API_SERVER = "without a Kubernetes Status"  # in the error of a 404 no API server sent


def typed_error(exc: BaseException, verb: str, resource: str, namespace: str | None, host: str = "") -> KubeError:
    """The one translation from the client's exceptions to bot.kube.errors."""
    at = f" at {host}" if host else ""
    if not isinstance(exc, ApiException) or exc.status is None:
        # urllib3 errors, timeouts, refused connections: is_transient() retried them already
        detail = " ".join(str(getattr(exc, "reason", None) or exc).split())
        return KubeUnavailable(f"Kubernetes API{at} unreachable ({verb} {resource}): {detail}")
    (message, reason), status = _status_of(exc), int(exc.status)
    if status == 404 and not _is_status_object(exc):  # a web server, not an API server, answered
        return KubeNotFound(f"{host or 'the server'} answered 404 to {verb} {resource} {NOT_AN_API_SERVER}: "
                            "is it a Kubernetes API server? (check the kubeconfig's server URL)",
                            status=status, reason=reason, server_message=message)
    if status == 403:
        return KubeForbidden(verb, resource, namespace, message)
    kind: type[KubeError] = KubeError
    if status == 404:
        kind = KubeNotFound
    elif status == 409 or (status == 422 and FAILED_TEST_OP in message):
        kind = KubeConflict
    elif status in (400, 422):
        kind = KubeInvalid
    elif is_transient(exc):
        kind = KubeUnavailable
    return kind(f"Kubernetes API error {status}: {message}", status=status, reason=reason,
                server_message=message)


def patch_bounds(within_seconds: float, request_timeout: float = 30.0) -> tuple[float, float]:
    """(per-attempt timeout, retry budget) for a patch that must end within `within_seconds`:
    half each, the timeout at most `request_timeout`. The last retry starts before the budget
    runs out (bot.support.retrying) and ends within its timeout, so the patch ends in time."""
    half = within_seconds / 2
    return min(request_timeout, half), half


# Every request asks for JSON (the generated methods' Accept for these calls) and authenticates
# as the configuration says: its bearer token, through the refresh hook the loaders install
# (in-cluster token rotation, exec plugins), or nothing when it has none.
ACCEPT_JSON = {"Accept": "application/json"}
AUTH_SETTINGS = ["BearerToken"]
Query = list[tuple[str, str | int | bool]]


def list_query(label_selector: str | None = None, field_selector: str | None = None,
               limit: int | None = None, continue_token: str | None = None) -> Query:
    """A list's query parameters, in the order the generated client sends them."""
    given = (("continue", continue_token), ("fieldSelector", field_selector),
             ("labelSelector", label_selector), ("limit", limit))
    return [(key, value) for key, value in given if value is not None]


def url_query(query: Query) -> str:
    """`key=value&...` as the client wrote it (ApiClient.parameters_to_url_query): booleans in
    lower case, each value quoted (a "/" kept), the keys as they are (ours are plain names)."""
    return "&".join(f"{key}={quote(str(value).lower() if isinstance(value, bool) else str(value))}"
                    for key, value in query)


# Characters urllib.parse.quote never changes, whatever its `safe`: a path part made only of them
# (a namespace, a pod's name: DNS labels) is its own quoting, and is not run through quote().
UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]+")


class KubeApi:
    """Thin, explicit wrapper: one method per API call the bot makes (see bot/kube/rbac.py).

    Each request is built here (path, query, headers with the configuration's bearer token, the
    body as JSON once) and sent on the client's own connection pool by bot.kube.wire: its TLS,
    certificates, proxy and kept connections, without the generic layer's per-call walks over
    the body and the headers and its email-package parsing of every answer's headers (a get_pod
    took 264 us of CPU that way on a quiet machine, 125 us now; see benchmarks/bench_kube_call.py).
    The paths are written once, in `_path`; the query parameters are sent in the generated
    client's order. The pod watch and the pod proxy still go through the client's own layers."""

    def __init__(self, api_client: client.ApiClient, retry: RetryPolicy | None = None,
                 request_timeout: float = 30.0, patch_within: float | None = None):
        """`patch_within`: seconds a workload patch may take with its retries (patch_bounds);
        None: like any other call."""
        self.api_client = api_client
        self.host = str(getattr(api_client.configuration, "host", "") or "")  # named in unreachable errors
        self.transport = Transport(api_client)  # the requests below, on the client's own pool
        self.core = client.CoreV1Api(api_client)  # for the pod watch: watch.Watch streams a generated method
        self.retry = retry or RetryPolicy()
        self.request_timeout = request_timeout
        self.page_size = PAGE_SIZE
        self.patch_timeout, self.patch_retry = request_timeout, self.retry
        if patch_within is not None:
            self.patch_timeout, budget = patch_bounds(patch_within, request_timeout)
            self.patch_retry = dataclasses.replace(self.retry, budget=budget)

    # -- plumbing
    def _path(self, api: tuple[str, ...], resource: str, namespace: str | None = None, name: str | None = None,
              subresource: str | None = None) -> str:
        """/{api}[/namespaces/{namespace}]/{resource}[/{name}[/{subresource}]], each part quoted as
        the client quotes a path parameter (a "/" in a name never reaches another path)."""
        parts = [*api, *(["namespaces", namespace] if namespace is not None else []), resource]
        parts += [part for part in (name, subresource) if part is not None]
        safe = self.api_client.configuration.safe_chars_for_path_param
        for part in parts:
            if not isinstance(part, str):  # a forged object's name, say; never sent
                raise ValueError(f"a Kubernetes API path part must be a string, not {type(part).__name__}: {part!r}")
        return "/" + "/".join(part if UNRESERVED.fullmatch(part) else quote(part, safe=safe) for part in parts)

    def _send(self, method: str, path: str, query: Query, body: Any, content_type: str | None,
              timeout: float) -> bytes:
        """One HTTP request, as the generated methods made it with _preload_content=False: the
        answer's body, or ApiException (typed by its status) when it is not a 2xx. The body is
        JSON written once, compactly (what the client's json.dumps wrote, without the spaces)."""
        target = f"{path}?{url_query(query)}" if query else path
        data = None if body is None else json.dumps(body, separators=(",", ":"),
                                                    default=self.api_client.sanitize_for_serialization).encode()
        try:
            answer = self.transport.send(method, target, self._headers(content_type), data, timeout)
        except SSLError as exc:  # as the client's rest.py reports a failed TLS handshake
            raise ApiException(status=0, reason="\n".join([type(exc).__name__, str(exc)])) from None
        if not 200 <= answer.status <= 299:
            raise ApiException.from_response(http_resp=answer, body=None, data=None)
        return answer.data

    def _headers(self, content_type: str | None) -> list[tuple[str, str]]:
        """Accept, Content-Type, the client's default headers (User-Agent) and cookie, and the
        bearer token as the configuration gives it now: auth_settings() runs the refresh hook the
        loaders install (in-cluster token rotation, exec plugins, expiring tokens) at every call."""
        headers = dict(ACCEPT_JSON)
        if content_type is not None:
            headers["Content-Type"] = content_type
        headers.update(self.api_client.default_headers)
        if self.api_client.cookie:
            headers["Cookie"] = self.api_client.cookie
        for name in AUTH_SETTINGS:
            auth = self.api_client.configuration.auth_settings().get(name)
            if auth and auth["in"] == "header" and auth["value"] is not None:
                headers[auth["key"]] = auth["value"]
        return list(headers.items())

    def _call(self, verb: str, resource: str, namespace: str | None, method: str, path: str,
              query: Query | None = None, body: Any = None, content_type: str | None = None,
              raw_text: bool = False, retry: RetryPolicy | None = None, timeout: float | None = None) -> Any:
        def once() -> Any:
            data = self._send(method, path, list(query or ()), body, content_type,
                              self.request_timeout if timeout is None else timeout)
            if raw_text:
                return data.decode("utf-8", errors="replace")
            return json.loads(data) if data else None

        try:
            return (retry or self.retry).run(once, api="kubernetes", call=f"{verb} {resource}",
                                             reason_of=transient_reason, retry_after_of=retry_after_seconds)
        except ApiException as exc:
            raise typed_error(exc, verb, resource, namespace, self.host) from None  # the message says it all
        except Exception as exc:
            if is_transient(exc):  # unreachable after the retries: keep the cause for the log
                raise typed_error(exc, verb, resource, namespace, self.host) from exc
            raise

    # -- core
    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call("get", "pods", namespace, "GET", self._path(CORE, "pods", namespace, name))

    def _list(self, resource: str, namespace: str | None, path: str, label_selector: str | None = None,
              field_selector: str | None = None) -> list[dict[str, Any]]:
        return [item for page, _ in self._pages(resource, namespace, path, label_selector, field_selector)
                for item in page]

    def _pages(self, resource: str, namespace: str | None, path: str, label_selector: str | None = None,
               field_selector: str | None = None) -> Iterator[tuple[list[dict[str, Any]], str]]:
        """A list, page by page (`limit` / `continue`): (items, the list's resourceVersion). A
        namespace of 10,000 pods is never one answer held whole in memory, and the caller may
        let each page go before the next is read."""
        token: str | None = None
        while True:
            query = list_query(label_selector, field_selector, self.page_size, token)
            body = self._call("list", resource, namespace, "GET", path, query) or {}
            meta = body.get("metadata") or {}
            yield list(body.get("items") or []), str(meta.get("resourceVersion") or "")
            token = meta.get("continue")
            if not token:
                return

    def list_pods(self, namespace: str, label_selector: str | None = None,
                  field_selector: str | None = None) -> list[dict[str, Any]]:
        return self._list("pods", namespace, self._path(CORE, "pods", namespace), label_selector, field_selector)

    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        return self._list("pods", None, self._path(CORE, "pods"), field_selector=f"spec.nodeName={node}")

    def read_log(self, namespace: str, pod: str, container: str, previous: bool = False,
                 limit_bytes: int | None = None, tail_lines: int | None = None) -> str:
        """The container's log. PreviousLogGone when `previous` and the kubelet no longer keeps it
        (it answers 400 "previous terminated container ... not found" for that)."""
        given = (("container", container), ("limitBytes", limit_bytes), ("previous", previous),
                 ("tailLines", tail_lines))
        query: Query = [(key, value) for key, value in given if value is not None]
        try:
            return self._call("get", "pods/log", namespace, "GET", self._path(CORE, "pods", namespace, pod, "log"),
                              query, raw_text=True)
        except KubeInvalid as exc:
            text = exc.server_message
            if previous and ("previous terminated container" in text or "not found" in text):
                raise PreviousLogGone(str(exc), exc.status, exc.reason, text) from None
            raise

    def list_events(self, namespace: str, involved_name: str) -> list[dict[str, Any]]:
        return self._list("events", namespace, self._path(CORE, "events", namespace),
                          field_selector=f"involvedObject.name={involved_name}")

    def create_event(self, namespace: str, event: dict[str, Any]) -> dict[str, Any]:
        # Typed by the client's Event model, as the generated method typed it: fields set to None
        # are left out, timestamps are sent as ISO 8601 with an offset, an unknown field is refused.
        body = client.CoreV1Event.model_validate(event)
        return self._call("create", "events", namespace, "POST", self._path(CORE, "events", namespace), body=body)

    def get_node(self, name: str) -> dict[str, Any]:
        return self._call("get", "nodes", None, "GET", self._path(CORE, "nodes", None, name))

    # -- apps
    def get_workload(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        resource = WORKLOAD_RESOURCES[kind]
        obj = self._call("get", f"{resource}.apps", namespace, "GET", self._path(APPS, resource, namespace, name))
        obj.setdefault("kind", kind)
        obj.setdefault("apiVersion", "apps/v1")
        return obj

    def find_workload(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """get_workload, or None when there is no such object."""
        try:
            return self.get_workload(kind, namespace, name)
        except KubeNotFound:
            return None

    def list_replicasets(self, namespace: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        return self._list("replicasets.apps", namespace, self._path(APPS, "replicasets", namespace), label_selector)

    def patch_workload(self, kind: str, namespace: str, name: str, ops: list[dict[str, Any]],
                       dry_run: bool = False) -> dict[str, Any]:
        """JSON Patch (RFC 6902). KubeConflict when the object changed (stale resourceVersion, a
        `test` op that no longer holds), KubeInvalid when the server refuses the result."""
        resource = WORKLOAD_RESOURCES[kind]
        query: Query = [("dryRun", "All")] if dry_run else []
        return self._call("patch", f"{resource}.apps", namespace, "PATCH", self._path(APPS, resource, namespace, name),
                          query, body=ops, content_type=JSON_PATCH, retry=self.patch_retry,
                          timeout=self.patch_timeout)

    # -- custom resources (incidents)
    def create_custom(self, group: str, version: str, namespace: str, plural: str,
                      body: dict[str, Any]) -> dict[str, Any]:
        return self._call("create", f"{plural}.{group}", namespace, "POST",
                          self._path(("apis", group, version), plural, namespace), body=body)

    def get_custom(self, group: str, version: str, namespace: str, plural: str, name: str) -> dict[str, Any]:
        return self._call("get", f"{plural}.{group}", namespace, "GET",
                          self._path(("apis", group, version), plural, namespace, name))

    def list_custom(self, group: str, version: str, namespace: str, plural: str,
                    label_selector: str | None = None) -> list[dict[str, Any]]:
        return self._list(f"{plural}.{group}", namespace, self._path(("apis", group, version), plural, namespace),
                          label_selector)

    def patch_custom(self, group: str, version: str, namespace: str, plural: str, name: str,
                     body: dict[str, Any] | list[dict[str, Any]]) -> dict[str, Any]:
        """A dict is sent as a merge patch, a list as a JSON Patch."""
        return self._call("patch", f"{plural}.{group}", namespace, "PATCH",
                          self._path(("apis", group, version), plural, namespace, name), body=body,
                          content_type=JSON_PATCH if isinstance(body, list) else MERGE_PATCH)

    def pod_pages(self, namespace: str | None, label_selector: str | None = None
                  ) -> Iterator[tuple[list[dict[str, Any]], str]]:
        """Pods of a namespace (None: all), page by page, each with the list's resourceVersion to
        watch from (bot.kube.watch)."""
        return self._pages("pods", namespace, self._path(CORE, "pods", namespace), label_selector)

    def list_pods_versioned(self, namespace: str | None, label_selector: str | None = None
                            ) -> tuple[list[dict[str, Any]], str]:
        """Pods of a namespace (None: all) and the list's resourceVersion, to watch from."""
        items: list[dict[str, Any]] = []
        version = ""
        for page, page_version in self.pod_pages(namespace, label_selector):
            items.extend(page)
            version = page_version
        return items, version

    def watch_pods(self, namespace: str | None, resource_version: str, label_selector: str | None = None,
                   timeout_seconds: int = 300, on_open: Callable[[Any], object] | None = None
                   ) -> Iterator[dict[str, Any]]:
        """One watch request on pods from `resource_version`, through the client's watch.Watch:
        the server's events as JSON ({"type", "object"}). A too-old resourceVersion raises KubeError
        with status 410 (list again); `on_open(w)` gets the Watch, whose stop() ends the stream."""
        w = _RawWatch()
        if on_open is not None:
            on_open(w)
        func: Callable[..., Any] = self.core.list_namespaced_pod
        args: tuple[str, ...] = (namespace,) if namespace is not None else ()
        if namespace is None:
            func = self.core.list_pod_for_all_namespaces
        try:
            for event in w.stream(func, *args, resource_version=resource_version, allow_watch_bookmarks=True,
                                  label_selector=label_selector, timeout_seconds=timeout_seconds,
                                  _request_timeout=(10, timeout_seconds + 30)):
                yield {"type": event.get("type"), "object": event.get("raw_object") or event.get("object") or {}}
        except ApiException as exc:
            raise typed_error(exc, "watch", "pods", namespace) from None


class _RawWatch(watch.Watch):
    """The client's Watch, yielding the server's JSON (camelCase dicts, as everywhere here) instead
    of deserialized models; 410 and other ERROR events still raise ApiException."""

    def get_return_type(self, func: Any) -> Any:
        return None

    def close(self) -> None:
        """stop() and close the open response, so a blocked read ends now."""
        self.stop()
        resp = getattr(self, "_resp", None)
        if resp is not None:
            try:
                resp.close()
            except Exception:
                pass


def _proxy_path(namespace: str, pod: str, port: int | None, path: str) -> str:
    target = f"{pod}:{port}" if port else pod
    return f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(target)}/proxy/{path.lstrip('/')}"


def proxy_pod(api: KubeApi, namespace: str, pod: str, port: int | None, method: str, path: str,
              body: dict[str, Any] | None = None, timeout: float = 30.0) -> tuple[int, str]:
    """An HTTP request to the pod through the API server's pod proxy subresource (pods/proxy):
    (status, text), whether the pod or the API server answered (a refusal is a Status object).
    No answer within `timeout`: TimeoutError; not reachable: KubeUnavailable."""
    client_ = api.api_client
    params = client_.param_serialize(method, _proxy_path(namespace, pod, port, path), body=body,
                                     header_params={"Content-Type": "application/json", "Accept": "application/json"})
    try:
        response = client_.call_api(*params, _request_timeout=timeout)
        data = response.read() or b""
        return int(response.status), data.decode("utf-8", errors="replace")
    except Exception as exc:
        if "timed out" in str(exc).lower() or "timeout" in type(exc).__name__.lower():
            raise TimeoutError(f"no answer from pod {namespace}/{pod} within {timeout:g} s") from None
        if is_transient(exc):
            raise typed_error(exc, method, "pods/proxy", namespace) from None
        raise
