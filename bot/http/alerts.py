"""`POST /alerts`: Alertmanager's webhook (version 4) parsed, authenticated and validated, and
its alerts handed to the work queue folded per workload (bot/app/work.py). Answers at once: a
webhook that waited for a diagnosis would time out and be re-sent. A valid batch is accepted
whole; only a bot that is far behind (executor.max_pending_alerts) answers 503, which
Alertmanager retries. Every refusal is counted by reason (vllm_oncall_http_rejected)."""

from __future__ import annotations

import hmac
import json
import logging
import re
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from bot.app.metrics import Metrics
from bot.app.records import AlertTarget
from bot.app.router import ClusterRouter, UnknownCluster
from bot.app.service import OncallService
from bot.app.work import InlineExecutor, Work, WorkQueue, fold_key
from bot.http.wire import printable

log = logging.getLogger(__name__)
MAX_JSON_DEPTH = 32
# Kubernetes object names: what the labels must be before they reach a log line, a Slack
# message or an API path (a newline or a `<!channel>` in a label is not a pod).
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class JSONError(ValueError):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def load_json(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """json.loads with a depth limit: deeply nested input is refused, never a RecursionError."""
    try:
        doc = json.loads(body)
    except RecursionError:
        raise JSONError("json_too_deep", f"JSON nested deeper than {max_depth} levels") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise JSONError("malformed_json", f"malformed JSON: {printable(exc, 200)}") from None
    level: list[Any] = [doc]
    for _ in range(max_depth):
        level = [child for node in level
                 for child in (node.values() if isinstance(node, dict) else node if isinstance(node, list) else ())
                 if isinstance(child, (dict, list))]
        if not level:
            return doc
    raise JSONError("json_too_deep", f"JSON nested deeper than {max_depth} levels")


# ---- Alertmanager webhook payload, version 4 ------------------------------------------------


class WebhookAlert(BaseModel):
    model_config = ConfigDict(extra="allow")
    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = {}
    startsAt: str | None = None
    endsAt: str | None = None
    generatorURL: str | None = None
    fingerprint: str | None = None


class WebhookPayload(BaseModel):
    """The envelope. Alerts are validated one by one (see AlertIntake) so one odd alert is
    reported and skipped while the others in the batch are still handled."""

    model_config = ConfigDict(extra="allow")
    version: str
    status: Literal["firing", "resolved"]
    receiver: str = ""
    alerts: list[dict[str, Any]]
    groupKey: str | None = None
    truncatedAlerts: int = 0


def one_line(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "payload"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


class AlertIntake:
    """Parse, authenticate and validate a webhook call; hand its alerts to the work queue.

    With several clusters (bot.app.router) each alert goes to the cluster its `cluster_label`
    names (Alertmanager's usual multi-cluster label), an unlabelled one to the default cluster;
    an alert for a cluster this bot does not serve is skipped (logged, counted), the others in
    the same webhook are still handled. A single cluster takes every alert, as it always did."""

    def __init__(self, service: OncallService | ClusterRouter, executor: WorkQueue | InlineExecutor,
                 alertnames: tuple[str, ...] | list[str] = ("KubePodCrashLooping",), token: str | None = None,
                 cluster_label: str = "cluster"):
        self.router = ClusterRouter.of(service)
        self.executor = executor
        self.alertnames = set(alertnames)
        self.token = token
        self.cluster_label = cluster_label
        self.metrics: Metrics = self.router.metrics

    def _refuse(self, status: int, reason: str, message: str) -> tuple[int, dict[str, Any]]:
        self.metrics.http_rejected.labels(reason).inc()
        return status, {"error": message}

    def receive(self, body: bytes, authorization: str | None) -> tuple[int, dict[str, Any]]:
        received_at = time.monotonic()
        if self.token is not None:
            expected = f"Bearer {self.token}".encode()
            if not hmac.compare_digest((authorization or "").encode("utf-8", "replace"), expected):
                return self._refuse(401, "unauthorized", "missing or wrong bearer token")
        try:
            doc = load_json(body)
        except JSONError as exc:
            return self._refuse(400, exc.reason, str(exc))
        try:
            payload = WebhookPayload.model_validate(doc)
        except ValidationError as exc:
            return self._refuse(400, "not_a_webhook", f"not an Alertmanager webhook payload: {one_line(exc)}")
        self._log_envelope(payload)
        works, skipped = self._works(payload, received_at)
        admission = self.executor.submit(works, self.router.handle_alert) if works else None
        if works and admission is None:
            return self._refuse(503, "busy", f"busy: too many alerts waiting to take {len(works)} more; retry later")
        if admission is not None:
            for outcome, count in admission.counts.items():
                if count:
                    self.metrics.webhook_alerts.labels(outcome).inc(count)
            self.metrics.alert_work_items.inc(admission.items)
        return 200, {"accepted": len(works), "skipped": skipped,
                     "duplicates": admission.counts["duplicate"] if admission else 0}

    def _log_envelope(self, payload: WebhookPayload) -> None:
        if payload.version != "4":
            log.warning("Alertmanager webhook version %s (expected 4); reading it as 4", printable(payload.version, 20))
        if payload.truncatedAlerts:
            log.warning("Alertmanager left out %d alert(s) of group %s (its max_alerts); they arrive with "
                        "the next notification", payload.truncatedAlerts, printable(payload.groupKey))

    def _works(self, payload: WebhookPayload, received_at: float) -> tuple[list[Work], list[dict[str, Any]]]:
        works: list[Work] = []
        skipped: list[dict[str, Any]] = []
        for index, raw in enumerate(payload.alerts):
            target, reason = self._target(raw, received_at)
            if target is None:
                skipped.append({"index": index, "reason": reason})
                self.metrics.alerts_skipped.labels(reason.split(":")[0]).inc()
                continue
            works.append(Work(fold_key(target.namespace, target.pod, target.cluster),
                              (target.cluster, target.namespace, target.pod, target.container), target))
        return works, skipped

    def _target(self, raw: dict[str, Any], received_at: float) -> tuple[AlertTarget | None, str]:
        try:
            alert = WebhookAlert.model_validate(raw)
        except ValidationError as exc:
            return None, f"invalid alert: {one_line(exc)}"
        name = alert.labels.get("alertname", "")
        if name not in self.alertnames:
            return None, f"ignored alertname: {printable(name, 100) or '(none)'}"
        missing = [k for k in ("namespace", "pod") if not alert.labels.get(k)]
        if missing:
            return None, f"missing label: {', '.join(missing)}"
        invalid = [k for k, form in (("namespace", _DNS_LABEL), ("pod", _DNS_SUBDOMAIN), ("container", _DNS_LABEL))
                   if alert.labels.get(k) and not form.fullmatch(alert.labels[k])]
        if invalid:
            return None, f"invalid label: {', '.join(invalid)} is not a Kubernetes name"
        try:
            cluster = self.router.for_alert(alert.labels.get(self.cluster_label)).cluster.name
        except UnknownCluster as exc:
            log.warning("alert for %s/%s skipped: %s", alert.labels["namespace"], alert.labels["pod"],
                        printable(exc, 300))
            return None, f"unknown cluster: {printable(exc.cluster, 100)}"
        return AlertTarget(namespace=alert.labels["namespace"], pod=alert.labels["pod"],
                           container=alert.labels.get("container") or None,
                           firing=alert.status == "firing", received_at=received_at,
                           cluster=cluster if len(self.router) > 1 else None), ""
