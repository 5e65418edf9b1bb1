"""`POST /alerts`: Alertmanager's webhook (version 4) parsed, authenticated and validated, one
job queued per matching alert. Answers at once: a webhook that waited for a diagnosis would time
out and be re-sent. When the queue is full the whole batch gets 503, which Alertmanager retries,
instead of silently dropping part of it."""

from __future__ import annotations

import functools
import hmac
import json
import logging
import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from bot.app.metrics import Metrics
from bot.app.records import AlertTarget
from bot.app.service import OncallService
from bot.http.executor import BoundedExecutor, InlineExecutor

log = logging.getLogger(__name__)


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
    """Parse, authenticate and validate a webhook call; queue one job per matching alert."""

    def __init__(self, service: OncallService, executor: BoundedExecutor | InlineExecutor,
                 alertnames: tuple[str, ...] | list[str] = ("KubePodCrashLooping",), token: str | None = None):
        self.service = service
        self.executor = executor
        self.alertnames = set(alertnames)
        self.token = token
        self.metrics: Metrics = service.metrics

    def receive(self, body: bytes, authorization: str | None) -> tuple[int, dict[str, Any]]:
        received_at = time.monotonic()
        if self.token is not None:
            expected = f"Bearer {self.token}".encode()
            if not hmac.compare_digest((authorization or "").encode(), expected):
                return 401, {"error": "missing or wrong bearer token"}
        try:
            doc = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return 400, {"error": f"malformed JSON: {exc}"}
        try:
            payload = WebhookPayload.model_validate(doc)
        except ValidationError as exc:
            return 400, {"error": f"not an Alertmanager webhook payload: {one_line(exc)}"}
        if payload.version != "4":
            log.warning("Alertmanager webhook version %s (expected 4); reading it as 4", payload.version)
        if payload.truncatedAlerts:
            log.warning("Alertmanager left out %d alert(s) of group %s (its max_alerts); they arrive with "
                        "the next notification", payload.truncatedAlerts, payload.groupKey)
        jobs: list[Callable[[], Any]] = []
        skipped: list[dict[str, Any]] = []
        for index, raw in enumerate(payload.alerts):
            target, reason = self._target(raw, received_at)
            if target is None:
                skipped.append({"index": index, "reason": reason})
                self.metrics.alerts_skipped.labels(reason.split(":")[0]).inc()
                continue
            jobs.append(functools.partial(self.service.handle_alert, target))
        if jobs and not self.executor.submit_all(jobs):
            return 503, {"error": f"busy: no room for {len(jobs)} alert(s); retry later"}
        return 200, {"accepted": len(jobs), "skipped": skipped}

    def _target(self, raw: dict[str, Any], received_at: float) -> tuple[AlertTarget | None, str]:
        try:
            alert = WebhookAlert.model_validate(raw)
        except ValidationError as exc:
            return None, f"invalid alert: {one_line(exc)}"
        name = alert.labels.get("alertname", "")
        if name not in self.alertnames:
            return None, f"ignored alertname: {name or '(none)'}"
        missing = [k for k in ("namespace", "pod") if not alert.labels.get(k)]
        if missing:
            return None, f"missing label: {', '.join(missing)}"
        return AlertTarget(namespace=alert.labels["namespace"], pod=alert.labels["pod"],
                           container=alert.labels.get("container") or None,
                           firing=alert.status == "firing", received_at=received_at), ""
