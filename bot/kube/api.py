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
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

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

log = logging.getLogger("bot.kube")

# kind -> (AppsV1Api method suffix, resource name for messages and RBAC)
WORKLOAD_RESOURCES = {
    "Deployment": ("deployment", "deployments"),
    "StatefulSet": ("stateful_set", "statefulsets"),
    "ReplicaSet": ("replica_set", "replicasets"),
}
JSON_PATCH = "application/json-patch+json"
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


class KubeApi:
    """Thin, explicit wrapper: one method per API call the bot makes (see bot/kube/rbac.py)."""

    def __init__(self, api_client: client.ApiClient, retry: RetryPolicy | None = None,
                 request_timeout: float = 30.0, patch_within: float | None = None):
        """`patch_within`: seconds a workload patch may take with its retries (patch_bounds);
        None: like any other call."""
        self.api_client = api_client
        self.host = str(getattr(api_client.configuration, "host", "") or "")  # named in unreachable errors
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.retry = retry or RetryPolicy()
        self.request_timeout = request_timeout
        self.page_size = PAGE_SIZE
        self.patch_timeout, self.patch_retry = request_timeout, self.retry
        if patch_within is not None:
            self.patch_timeout, budget = patch_bounds(patch_within, request_timeout)
            self.patch_retry = dataclasses.replace(self.retry, budget=budget)

    # -- plumbing
    def _call(self, verb: str, resource: str, namespace: str | None, fn: Callable[..., Any],
              *args: Any, raw_text: bool = False, retry: RetryPolicy | None = None, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", self.request_timeout)
        kwargs["_preload_content"] = False

        def once() -> Any:
            response = fn(*args, **kwargs)
            data = response.data
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
        return self._call("get", "pods", namespace, self.core.read_namespaced_pod, name, namespace)

    def _list(self, resource: str, namespace: str | None, fn: Callable[..., Any], *args: Any,
              **kwargs: Any) -> list[dict[str, Any]]:
        return [item for page, _ in self._pages(resource, namespace, fn, *args, **kwargs) for item in page]

    def _pages(self, resource: str, namespace: str | None, fn: Callable[..., Any], *args: Any,
               **kwargs: Any) -> Iterator[tuple[list[dict[str, Any]], str]]:
        """A list, page by page (`limit` / `continue`): (items, the list's resourceVersion). A
        namespace of 10,000 pods is never one answer held whole in memory, and the caller may
        let each page go before the next is read."""
        token: str | None = None
        while True:
            body = self._call("list", resource, namespace, fn, *args, limit=self.page_size,
                              _continue=token, **kwargs) or {}
            meta = body.get("metadata") or {}
            yield list(body.get("items") or []), str(meta.get("resourceVersion") or "")
            token = meta.get("continue")
            if not token:
                return

    def list_pods(self, namespace: str, label_selector: str | None = None,
                  field_selector: str | None = None) -> list[dict[str, Any]]:
        return self._list("pods", namespace, self.core.list_namespaced_pod, namespace,
                          label_selector=label_selector, field_selector=field_selector)

    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        return self._list("pods", None, self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}")

    def read_log(self, namespace: str, pod: str, container: str, previous: bool = False,
                 limit_bytes: int | None = None, tail_lines: int | None = None) -> str:
        """The container's log. PreviousLogGone when `previous` and the kubelet no longer keeps it
        (it answers 400 "previous terminated container ... not found" for that)."""
        try:
            return self._call("get", "pods/log", namespace, self.core.read_namespaced_pod_log, pod, namespace,
                              container=container, previous=previous, limit_bytes=limit_bytes,
                              tail_lines=tail_lines, raw_text=True)
        except KubeInvalid as exc:
            text = exc.server_message
            if previous and ("previous terminated container" in text or "not found" in text):
                raise PreviousLogGone(str(exc), exc.status, exc.reason, text) from None
            raise

    def list_events(self, namespace: str, involved_name: str) -> list[dict[str, Any]]:
        return self._list("events", namespace, self.core.list_namespaced_event, namespace,
                          field_selector=f"involvedObject.name={involved_name}")

    def create_event(self, namespace: str, event: dict[str, Any]) -> dict[str, Any]:
        return self._call("create", "events", namespace, self.core.create_namespaced_event, namespace, event)

    def get_node(self, name: str) -> dict[str, Any]:
        return self._call("get", "nodes", None, self.core.read_node, name)

    # -- apps
    def get_workload(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        method, resource = WORKLOAD_RESOURCES[kind]
        obj = self._call("get", f"{resource}.apps", namespace,
                         getattr(self.apps, f"read_namespaced_{method}"), name, namespace)
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
        return self._list("replicasets.apps", namespace, self.apps.list_namespaced_replica_set,
                          namespace, label_selector=label_selector)

    def patch_workload(self, kind: str, namespace: str, name: str, ops: list[dict[str, Any]],
                       dry_run: bool = False) -> dict[str, Any]:
        """JSON Patch (RFC 6902). KubeConflict when the object changed (stale resourceVersion, a
        `test` op that no longer holds), KubeInvalid when the server refuses the result."""
        method, resource = WORKLOAD_RESOURCES[kind]
        return self._call("patch", f"{resource}.apps", namespace,
                          getattr(self.apps, f"patch_namespaced_{method}"), name, namespace, ops,
                          dry_run="All" if dry_run else None, _content_type=JSON_PATCH,
                          retry=self.patch_retry, _request_timeout=self.patch_timeout)

    # -- custom resources (incidents)
    def create_custom(self, group: str, version: str, namespace: str, plural: str,
                      body: dict[str, Any]) -> dict[str, Any]:
        return self._call("create", f"{plural}.{group}", namespace, self.custom.create_namespaced_custom_object,
                          group, version, namespace, plural, body)

    def get_custom(self, group: str, version: str, namespace: str, plural: str, name: str) -> dict[str, Any]:
        return self._call("get", f"{plural}.{group}", namespace, self.custom.get_namespaced_custom_object,
                          group, version, namespace, plural, name)

    def list_custom(self, group: str, version: str, namespace: str, plural: str,
                    label_selector: str | None = None) -> list[dict[str, Any]]:
        return self._list(f"{plural}.{group}", namespace, self.custom.list_namespaced_custom_object,
                          group, version, namespace, plural, label_selector=label_selector)

    def patch_custom(self, group: str, version: str, namespace: str, plural: str, name: str,
                     body: dict[str, Any] | list[dict[str, Any]]) -> dict[str, Any]:
        """A dict is sent as a merge patch, a list as a JSON Patch."""
        return self._call("patch", f"{plural}.{group}", namespace, self.custom.patch_namespaced_custom_object,
                          group, version, namespace, plural, name, body,
                          _content_type=JSON_PATCH if isinstance(body, list) else MERGE_PATCH)


    def pod_pages(self, namespace: str | None, label_selector: str | None = None
                  ) -> Iterator[tuple[list[dict[str, Any]], str]]:
        """Pods of a namespace (None: all), page by page, each with the list's resourceVersion to
        watch from (bot.kube.watch)."""
        if namespace is None:
            return self._pages("pods", None, self.core.list_pod_for_all_namespaces, label_selector=label_selector)
        return self._pages("pods", namespace, self.core.list_namespaced_pod, namespace, label_selector=label_selector)

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
    from urllib.parse import quote

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
