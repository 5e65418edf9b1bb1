"""Configuration of `vllm-oncall serve`: environment variables, optionally a YAML file.

Every setting has one environment variable (listed in ENV_VARS). In the YAML file a setting's key
is its environment variable in lower case (`vllm_oncall_cluster`) or its name (`cluster_name`);
the environment wins over the file. Validation collects every problem at
once and names the variable, so a broken deployment says everything that is wrong in one go.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from bot.app.pacing import PaceRules
from bot.llm.settings import LLMSettings
from bot.slack import ids as slack_ids

# setting name -> environment variable. Slack's own variables keep Slack's usual names.
ENV_VARS: dict[str, str] = {
    "cluster_name": "VLLM_ONCALL_CLUSTER",
    "clusters": "VLLM_ONCALL_CLUSTERS",
    "cluster_label": "VLLM_ONCALL_CLUSTER_LABEL",
    "slack_bot_token": "SLACK_BOT_TOKEN",
    "slack_app_token": "SLACK_APP_TOKEN",
    "slack_signing_secret": "SLACK_SIGNING_SECRET",
    "slack_channel": "VLLM_ONCALL_SLACK_CHANNEL",
    "slack_api_url": "SLACK_API_URL",
    "slack_ping_seconds": "VLLM_ONCALL_SLACK_PING_SECONDS",
    "approver_users": "VLLM_ONCALL_APPROVERS",
    "approver_groups": "VLLM_ONCALL_APPROVER_GROUPS",
    "approver_scopes": "VLLM_ONCALL_APPROVER_SCOPES",
    "why_scope": "VLLM_ONCALL_WHY_SCOPE",
    "alert_token": "VLLM_ONCALL_ALERT_TOKEN",
    "alerts_unauthenticated": "VLLM_ONCALL_ALERTS_UNAUTHENTICATED",
    "alertnames": "VLLM_ONCALL_ALERTNAMES",
    "proposal_ttl_seconds": "VLLM_ONCALL_PROPOSAL_TTL_SECONDS",
    "verify_timeout_seconds": "VLLM_ONCALL_VERIFY_TIMEOUT_SECONDS",
    "listen": "VLLM_ONCALL_LISTEN",
    "workers": "VLLM_ONCALL_WORKERS",
    "queue_size": "VLLM_ONCALL_QUEUE_SIZE",
    "store": "VLLM_ONCALL_STORE",
    "state_dir": "VLLM_ONCALL_STATE_DIR",
    "incident_namespace": "VLLM_ONCALL_INCIDENT_NAMESPACE",
    "default_namespace": "VLLM_ONCALL_DEFAULT_NAMESPACE",
    "cluster_source": "VLLM_ONCALL_CLUSTER_SOURCE",
    "bundle_dir": "VLLM_ONCALL_BUNDLE_DIR",
    "kube_context": "VLLM_ONCALL_KUBE_CONTEXT",
    "slack_max_attempts": "VLLM_ONCALL_SLACK_MAX_ATTEMPTS",
    "slack_max_retry_after_seconds": "VLLM_ONCALL_SLACK_MAX_RETRY_AFTER_SECONDS",
    "sweep_interval_seconds": "VLLM_ONCALL_SWEEP_INTERVAL_SECONDS",
    "post_lease_seconds": "VLLM_ONCALL_POST_LEASE_SECONDS",
    "apply_grace_seconds": "VLLM_ONCALL_APPLY_GRACE_SECONDS",
    "slack_timeout_seconds": "VLLM_ONCALL_SLACK_TIMEOUT_SECONDS",
    "slack_post_interval": "VLLM_ONCALL_SLACK_POST_INTERVAL",
    "slack_update_interval": "VLLM_ONCALL_SLACK_UPDATE_INTERVAL",
    "mode": "VLLM_ONCALL_MODE",
    "playbooks": "VLLM_ONCALL_PLAYBOOKS",
    "redact_patterns": "VLLM_ONCALL_REDACT_PATTERNS",
    "seal_key": "VLLM_ONCALL_SEAL_KEY",
    "watch": "VLLM_ONCALL_WATCH",
    "watch_namespaces": "VLLM_ONCALL_WATCH_NAMESPACES",
    "watch_label_selector": "VLLM_ONCALL_WATCH_LABEL_SELECTOR",
    "verify_soak_seconds": "VLLM_ONCALL_VERIFY_SOAK_SECONDS",
    "verify_request_timeout_seconds": "VLLM_ONCALL_VERIFY_REQUEST_TIMEOUT_SECONDS",
    "verify_request_via": "VLLM_ONCALL_VERIFY_REQUEST_VIA",
    "prometheus_url": "VLLM_ONCALL_PROMETHEUS_URL",
    "runbook_url": "VLLM_ONCALL_RUNBOOK_URL",
    "dashboard_url": "VLLM_ONCALL_DASHBOARD_URL",
    "llm_base_url": "VLLM_ONCALL_LLM_BASE_URL",
    "llm_model": "VLLM_ONCALL_LLM_MODEL",
    "llm_api_key": "VLLM_ONCALL_LLM_API_KEY",
    "llm_timeout_seconds": "VLLM_ONCALL_LLM_TIMEOUT_SECONDS",
    "llm_calls_per_hour": "VLLM_ONCALL_LLM_CALLS_PER_HOUR",
}
# a YAML key -> the setting: the setting's name, or its environment variable in lower case
FILE_KEYS: dict[str, str] = {**{name: name for name in ENV_VARS}, **{var.lower(): name for name, var in ENV_VARS.items()}}
CONFIG_FILE_VAR = "VLLM_ONCALL_CONFIG"
LIST_SETTINGS = {"approver_users", "approver_groups", "alertnames", "playbooks", "watch_namespaces"}
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
CLUSTER_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a DNS label: it starts incident names


class SettingsError(ValueError):
    """Every problem found, one per line, each naming its environment variable."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        if len(problems) == 1:  # one problem, one line
            super().__init__(f"invalid configuration: {problems[0]}")
        else:
            super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in problems))


class Group(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SlackSettings(Group):
    bot_token: str
    app_token: str | None = None
    signing_secret: str | None = None
    channel: str = Field(min_length=1)
    api_url: str | None = None  # a Slack stand-in in tests; Slack's own URL when None
    # Socket Mode: the WebSocket ping interval. A connection whose last 4 pings went unanswered
    # (and no pong for 4 intervals) is taken as dead and replaced (bot/slack/socket_mode.py), so
    # this bounds how long a silently dropped socket goes unnoticed. Bolt's default, 10 s, unless set.
    ping_seconds: float = Field(default=10, gt=0, le=300)
    max_attempts: int = Field(default=5, ge=1, le=20)
    max_retry_after_seconds: float = Field(default=60, ge=0)
    timeout_seconds: int = Field(default=10, ge=1, le=300)  # one Slack Web API request
    # The chat's pace (bot.app.pacing), in seconds: between two posts in one channel, between two
    # message updates. Slack's rate by default; 0 = unpaced, for a Slack-compatible endpoint with
    # other limits (or none, as the benchmarks' stand-in).
    post_interval: float = Field(default=PaceRules.post_interval, ge=0, le=60)
    update_interval: float = Field(default=PaceRules.update_interval, ge=0, le=60)

    @field_validator("bot_token")
    @classmethod
    def _bot_token(cls, v: str) -> str:
        if not v.startswith("xoxb-"):
            raise ValueError("must be a bot token starting with xoxb-")
        return v

    @property
    def pace(self) -> PaceRules:
        return PaceRules(post_interval=self.post_interval, update_interval=self.update_interval)

    @field_validator("app_token")
    @classmethod
    def _app_token(cls, v: str | None) -> str | None:
        if v and not v.startswith("xapp-"):
            raise ValueError("must be an app-level token starting with xapp- (Socket Mode)")
        return v or None

    @field_validator("channel")
    @classmethod
    def _channel_id(cls, v: str) -> str:
        # After an unclear answer from Slack the bot looks for its message in the channel's history
        # (conversations.history), which takes an ID only: a #name could not be checked, so the
        # bot could neither prove a post happened nor safely post again.
        if not slack_ids.is_channel(v):
            raise ValueError(f"must be the channel's ID (like C0123ABCDEF, in the channel's About tab), not "
                             f"{v!r}: the bot checks the channel's history by ID before posting again")
        return v


class HttpSettings(Group):
    """The HTTP server: /alerts (Alertmanager), /healthz, /readyz, /metrics, /slack/events."""

    listen: str = "0.0.0.0:8080"
    # The one work queue's workers (webhook and pod watch). The work waits on the Kubernetes API and
    # Slack far more than it computes (about 30 ms of CPU in a ~1 s job on a busy 2-core machine):
    # benchmarks/bench_scale.py at 10 senders gave 12.9 alerts/s with 16 against 6.0 with 4 (one run,
    # load ~28). One workload's items still never run at once (bot/app/work.py).
    workers: int = Field(default=16, ge=1, le=64)
    queue_size: int = Field(default=100, ge=1)
    alert_token: str | None = None
    # /alerts without a bearer token only when the operator says so: the endpoint can ask for a
    # diagnosis and post to the channel, so an unset token must be a choice, not an omission.
    alerts_unauthenticated: bool = False
    alertnames: list[str] = Field(default_factory=lambda: ["KubePodCrashLooping"])

    @field_validator("alertnames")
    @classmethod
    def _some_alertnames(cls, v: list[str]) -> list[str]:
        names = [n.strip() for n in v if n.strip()]
        if not names:
            raise ValueError("is empty: name at least one alert, e.g. KubePodCrashLooping (else every alert is skipped)")
        return names

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        host, _, port = v.rpartition(":")
        if not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError("must be HOST:PORT, e.g. 0.0.0.0:8080")
        return v

    def alert_auth_refusal(self) -> str | None:
        """Why `serve` must not start with these alert settings (one line), or None."""
        if self.alert_token or self.alerts_unauthenticated:
            return None
        return (f"{ENV_VARS['alert_token']} is not set: set it to the bearer token Alertmanager sends, or set "
                f"{ENV_VARS['alerts_unauthenticated']}=true if only trusted senders can reach /alerts")

    def alert_auth_warning(self) -> str | None:
        """The loud start-up line of an install that accepts unauthenticated alerts, or None."""
        if self.alert_token or not self.alerts_unauthenticated:
            return None
        return (f"/alerts accepts alerts WITHOUT a bearer token ({ENV_VARS['alerts_unauthenticated']}=true): "
                "anyone who can reach it can open incidents and post to the channel")

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host or "0.0.0.0", int(port)


class KubeSettings(Group):
    context: str | None = None  # the kubeconfig context of the one cluster (None: in-cluster or current)
    incident_namespace: str | None = None  # where VLLMIncident objects live (None: the bot's own namespace)


class PodWatchSettings(Group):
    """A pod watch: diagnose at a vLLM container's first crash, not 16-21 minutes later (bot/kube/watch.py)."""

    enabled: bool = False
    namespaces: list[str] = Field(default_factory=list)  # empty: all namespaces
    label_selector: str | None = None  # None: vLLM containers recognised by image / command


def _http_url(v: str | None) -> str | None:
    """An http(s) URL with a host, or None: "prometheus:9090" would be read as scheme "prometheus"."""
    if not v:
        return None
    parts = urlsplit(v)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be an http:// or https:// URL with a host, like http://prometheus:9090 (got {v!r})")
    return v


class VerifySettings(Group):
    """Verification after an applied change: Ready + KV line, a completion request, a soak (bot/app/rollout.py)."""

    timeout_seconds: float = Field(default=900, gt=0)
    soak_seconds: float = Field(default=600, ge=0)
    request_timeout_seconds: float = Field(default=60, gt=0)
    request_via: Literal["proxy", "pod-ip"] = "proxy"
    prometheus_url: str | None = None  # dcgm-exporter's GPU memory over the soak (bot/kube/prometheus.py)

    _prometheus_url = field_validator("prometheus_url")(_http_url)


class LLMOptions(Group):
    """The optional LLM commentator (bot/llm): nothing is sent unless base_url is set."""

    base_url: str | None = None
    model: str = "default"
    api_key: str = "not-needed"
    timeout_seconds: float = Field(default=5.0, gt=0, le=120)
    calls_per_hour: int = Field(default=60, ge=0)

    _base_url = field_validator("base_url")(_http_url)

    def endpoint(self) -> LLMSettings | None:
        """The commentator's settings; None unless VLLM_ONCALL_LLM_BASE_URL is set."""
        if not self.base_url:
            return None
        return LLMSettings(base_url=self.base_url, model=self.model, api_key=self.api_key,
                           timeout_seconds=self.timeout_seconds, calls_per_hour=self.calls_per_hour)


# A grouped setting's flat name (its YAML key; ENV_VARS names its variable) -> (group, field).
GROUPED: dict[str, tuple[str, str]] = {
    **{f"slack_{f}": ("slack", f) for f in SlackSettings.model_fields},
    **{f: ("http", f) for f in HttpSettings.model_fields},
    "kube_context": ("kube", "context"), "incident_namespace": ("kube", "incident_namespace"),
    "watch": ("watch", "enabled"), "watch_namespaces": ("watch", "namespaces"),
    "watch_label_selector": ("watch", "label_selector"),
    **{f"verify_{f}": ("verify", f) for f in VerifySettings.model_fields if f != "prometheus_url"},
    "prometheus_url": ("verify", "prometheus_url"),
    **{f"llm_{f}": ("llm", f) for f in LLMOptions.model_fields},
}
FLAT_NAME = {where: name for name, where in GROUPED.items()}


class Settings(BaseModel):
    """The one settings model: what the whole bot is configured with, grouped by the part that
    uses it (slack, http, kube, watch, verify, llm); the application's Policy is derived from
    it in one place (bot.cli.wiring.policy_of)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    slack: SlackSettings
    http: HttpSettings = Field(default_factory=HttpSettings)
    kube: KubeSettings = Field(default_factory=KubeSettings)
    watch: PodWatchSettings = Field(default_factory=PodWatchSettings)
    verify: VerifySettings = Field(default_factory=VerifySettings)
    llm: LLMOptions = Field(default_factory=LLMOptions)
    cluster_name: str = Field(min_length=1, max_length=63)  # with `clusters`: the default one
    # Several clusters in one process (bot.app.router): cluster name -> kubeconfig context, e.g.
    # `prod-eu=ctx-eu,prod-us=ctx-us`. Empty: the one cluster of cluster_name and kube_context.
    clusters: dict[str, str] = Field(default_factory=dict)
    cluster_label: str = "cluster"  # the alert label naming the cluster (Alertmanager's usual one)
    approver_users: list[str] = Field(default_factory=list)
    approver_groups: list[str] = Field(default_factory=list)
    # Approvers of some namespaces only: `ns-glob=U1,S2,@C3;other-*=U4` (@C: where a click counts),
    # or in the file a mapping of globs to lists. The two flat lists above approve every namespace.
    approver_scopes: dict[str, list[str]] = Field(default_factory=dict)
    # `/vllm why` for a namespace: channel = only in the alert channel or by its approvers; open = anyone
    why_scope: Literal["channel", "open"] = "channel"
    proposal_ttl_seconds: float = Field(default=3600, gt=0)
    store: Literal["kube", "folder"] = "kube"
    state_dir: Path = Path(".vllm-oncall")
    default_namespace: str = "default"
    cluster_source: Literal["kube", "local"] = "kube"
    bundle_dir: Path | None = None
    sweep_interval_seconds: float = Field(default=30, gt=0)
    # Recovery time-outs. The post lease: how long one attempt holds the right to post an incident
    # (a replica that died mid-post is taken over after it); a post's retries get half of it, so
    # the Slack timeout must be under half of it. The apply grace: how long an incident may sit in
    # `applying` before the sweep takes it over; the Kubernetes patch gets a quarter of it for its
    # retries and at most a quarter (and 30 s) per attempt, and starts only while it can end inside it.
    post_lease_seconds: float = Field(default=60, gt=0)
    apply_grace_seconds: float = Field(default=120, ge=4)
    # proposals-only: post diagnoses and proposals, never offer Approve (deploy/ starts here);
    # approve: Approve/Reject buttons for the approvers. The default keeps what `serve` always did.
    mode: Literal["proposals-only", "approve"] = "approve"
    playbooks: list[Path] = Field(default_factory=list)  # extra folders, merged over the bundled ones
    # Extra secret formats to mask wherever text leaves the cluster (bot.diagnosis.redact): regular
    # expressions; the match (or its group named `secret`) becomes ***. In the environment: one per
    # line, or a JSON list (a comma may be part of a pattern, so commas do not separate them).
    redact_patterns: list[str] = Field(default_factory=list)
    # The key sealing the bot's own incident text (bot/app/seal.py); unset: derived from the bot token.
    seal_key: str | None = None
    # Links in an incident's details: URL templates with {namespace}, {workload}, {pod}, {cluster}
    # (URL-encoded). One template for every cluster, or per cluster: a JSON object / a YAML
    # mapping of cluster name (or "*" for the rest) to template.
    runbook_url: dict[str, str] = Field(default_factory=dict)
    dashboard_url: dict[str, str] = Field(default_factory=dict)

    @field_validator("runbook_url", "dashboard_url", mode="before")
    @classmethod
    def _link_templates(cls, v: Any) -> Any:
        return _templates(v)

    @field_validator("approver_users")
    @classmethod
    def _user_ids(cls, v: list[str]) -> list[str]:
        bad = [u for u in v if not slack_ids.is_user(u)]
        if bad:
            raise ValueError(f"Slack user ids start with U or W, not {', '.join(bad)}")
        return v

    @field_validator("approver_groups")
    @classmethod
    def _group_ids(cls, v: list[str]) -> list[str]:
        bad = [g for g in v if not slack_ids.is_group(g)]
        if bad:
            raise ValueError(f"Slack user group ids start with S, not {', '.join(bad)}")
        return v

    @field_validator("approver_scopes", mode="before")
    @classmethod
    def _scopes(cls, v: Any) -> Any:
        if v is None or v == "":
            return {}
        scopes = slack_ids.parse_scopes(v)  # a ValueError names the bad part
        return {s.namespaces: sorted(s.users | s.groups) + sorted(f"@{c}" for c in s.channels) for s in scopes}

    @field_validator("redact_patterns")
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        from bot.diagnosis.redact import RedactionPatternError, compile_patterns

        try:
            compile_patterns(v)
        except RedactionPatternError as exc:
            raise ValueError(str(exc)) from None
        return v

    @field_validator("cluster_label")
    @classmethod
    def _label(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError("must be a Prometheus label name (letters, digits, _), e.g. cluster")
        return v

    @model_validator(mode="after")
    def _combinations(self) -> Settings:
        problems = []
        if not self.slack.app_token and not self.slack.signing_secret:
            problems.append(f"{ENV_VARS['slack_signing_secret']}: required when {ENV_VARS['slack_app_token']} "
                            "is not set (Slack then calls /slack/events over HTTP and signs each request)")
        if self.mode == "approve" and not self.approver_users and not self.approver_groups \
                and not self.approver_scopes:
            problems.append(f"{ENV_VARS['approver_users']} or {ENV_VARS['approver_groups']}: set at least one "
                            f"approver, otherwise nobody may click Approve ({ENV_VARS['mode']}=approve)")
        if self.watch.enabled and self.cluster_source != "kube":
            problems.append(f"{ENV_VARS['watch']}: needs {ENV_VARS['cluster_source']}=kube (it watches pods)")
        if self.cluster_source == "local" and self.bundle_dir is None:
            problems.append(f"{ENV_VARS['bundle_dir']}: required when {ENV_VARS['cluster_source']}=local")
        elif self.bundle_dir is not None and not self.bundle_dir.is_dir():
            problems.append(f"{ENV_VARS['bundle_dir']}: {self.bundle_dir} is not a folder (an evidence bundle "
                            "with previous.log)")
        problems += self._cluster_combinations()
        problems += self._link_clusters()
        problems += self._lease_fits()
        problems += self._renewals_fit()
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _link_clusters(self) -> list[str]:
        """A per-cluster link template must name a cluster this bot serves (or "*")."""
        from bot.app.links import ALL_CLUSTERS

        served = {self.cluster_name, *self.clusters, ALL_CLUSTERS}
        return [f"{ENV_VARS[name]}: no cluster named {cluster!r} is served (known: {', '.join(sorted(served))})"
                for name in ("runbook_url", "dashboard_url") for cluster in getattr(self, name) if cluster not in served]

    def _lease_fits(self) -> list[str]:
        from bot.slack.chat import post_fits_lease

        if post_fits_lease(self.post_lease_seconds, self.slack.timeout_seconds):
            return []
        return [f"{ENV_VARS['post_lease_seconds']} ({self.post_lease_seconds:g}) must be more than twice "
                f"{ENV_VARS['slack_timeout_seconds']} ({self.slack.timeout_seconds}): a post's retries get half "
                "the lease and its last attempt must end inside it, or another replica may post the incident too"]

    def _renewals_fit(self) -> list[str]:
        """A running verification's lease (the apply grace) is renewed by every sweep: at least two
        sweeps must fall inside it, or a live replica's verification could be taken over."""
        if self.sweep_interval_seconds * 2 < self.apply_grace_seconds:
            return []
        return [f"{ENV_VARS['sweep_interval_seconds']} ({self.sweep_interval_seconds:g}) must be less than half "
                f"{ENV_VARS['apply_grace_seconds']} ({self.apply_grace_seconds:g}): each sweep renews the verify "
                "lease of the rollouts this replica follows"]

    def _cluster_combinations(self) -> list[str]:
        if not self.clusters:
            return []
        var, problems = ENV_VARS["clusters"], []
        if self.cluster_source != "kube":
            problems.append(f"{var}: needs {ENV_VARS['cluster_source']}=kube (each cluster is a kubeconfig context)")
        if self.store != "kube":
            problems.append(f"{var}: needs {ENV_VARS['store']}=kube (each cluster keeps its own incidents)")
        if self.kube.context:
            problems.append(f"{ENV_VARS['kube_context']}: not with {var} (there each cluster names its context)")
        if self.cluster_name not in self.clusters:
            problems.append(f"{ENV_VARS['cluster_name']}: the default cluster must be one of {var} "
                            f"({', '.join(self.clusters)}), not {self.cluster_name!r}")
        return problems

    @property
    def contexts(self) -> dict[str, str | None]:
        """Every cluster served -> its kubeconfig context (None: in-cluster or the current one),
        the default cluster first."""
        if not self.clusters:
            return {self.cluster_name: self.kube.context}
        return {self.cluster_name: self.clusters[self.cluster_name],
                **{n: c for n, c in self.clusters.items() if n != self.cluster_name}}

    def incident_namespace_or_default(self) -> str:
        """Where incident objects live: configured, else the bot's own namespace, else vllm-oncall."""
        if self.kube.incident_namespace:
            return self.kube.incident_namespace
        if SERVICE_ACCOUNT_NAMESPACE.is_file():
            return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
        return "vllm-oncall"


def _templates(value: Any) -> dict[str, str]:
    """A link setting: one template (every cluster), or cluster -> template (a mapping, or a JSON
    object in the environment); each template checked (bot.app.links.template_problem)."""
    import json

    from bot.app.links import ALL_CLUSTERS, template_problem

    if value is None or value == "":
        return {}
    if isinstance(value, str) and value.lstrip().startswith('{"'):  # "{namespace}/…" is a template
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a JSON object of cluster name to URL template ({exc.msg})") from None
    per_cluster = {ALL_CLUSTERS: value} if isinstance(value, str) else value
    if not isinstance(per_cluster, Mapping) or not all(isinstance(t, str) for t in per_cluster.values()):
        raise ValueError("expected a URL template, or a mapping of cluster name to URL template")
    for cluster, template in per_cluster.items():
        problem = template_problem(template)
        if problem:
            raise ValueError(problem if cluster == ALL_CLUSTERS else f"for cluster {cluster}: {problem}")
    return {str(k): v for k, v in per_cluster.items()}


def _pattern_list(value: str) -> list[str] | str:
    """VLLM_ONCALL_REDACT_PATTERNS: a JSON list, else one pattern per line."""
    import json

    if value.lstrip().startswith("["):
        try:
            doc = json.loads(value)
        except json.JSONDecodeError:
            return value  # not a list: validation names the variable
        return [str(p) for p in doc] if isinstance(doc, list) else value
    return [line.strip() for line in value.splitlines() if line.strip()]


def _split_list(value: str) -> list[str]:
    return [part.strip() for part in value.replace(";", ",").split(",") if part.strip()]


def load_settings(env: Mapping[str, str] | None = None, config_file: str | Path | None = None,
                  overrides: Mapping[str, Any] | None = None) -> Settings:
    """Settings from the file (if any) overlaid with the environment, then with `overrides` (the
    command line's options, by setting name). Raises SettingsError."""
    env = os.environ if env is None else env
    config_file = config_file or env.get(CONFIG_FILE_VAR)
    raw, problems = _read_file(Path(config_file)) if config_file else ({}, [])
    raw.update(_read_env(env))
    raw.update(overrides or {})
    _lists_from_strings(raw)
    problems.extend(_clusters(raw, env))
    try:
        settings = Settings(**_grouped(raw))
    except ValidationError as exc:
        problems.extend(_describe(exc, raw))
        raise SettingsError(problems) from None
    if problems:
        raise SettingsError(problems)
    return settings


def _grouped(raw: dict[str, Any]) -> dict[str, Any]:
    """Flat setting names (as the environment and the file give them) -> Settings' groups."""
    out: dict[str, Any] = {group: {} for group in ("slack", "http", "kube", "watch", "verify", "llm")}
    for name, value in raw.items():
        group, field = GROUPED.get(name, (None, name))
        (out[group] if group else out)[field] = value
    return out


def _read_file(path: Path) -> tuple[dict[str, Any], list[str]]:
    """The YAML file's settings by name, and one line per unknown or repeated key. A file that
    cannot be read or parsed is a SettingsError at once."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise SettingsError([f"{path}: cannot read the configuration file ({exc.strerror})"]) from None
    except yaml.YAMLError as exc:
        raise SettingsError([f"{path}: not valid YAML ({exc})"]) from None
    if not isinstance(doc, dict):
        raise SettingsError([f"{path}: expected a mapping of setting names to values"])
    raw: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in doc.items():
        name = FILE_KEYS.get(str(key).lower())
        if name is None:
            known = ", ".join(sorted(var.lower() for var in ENV_VARS.values()))
            problems.append(f"{path}: unknown setting {key!r} (known: {known})")
        elif name in raw:
            problems.append(f"{path}: {key!r} sets {name} a second time")
        else:
            raw[name] = value
    return raw, problems


def _read_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The environment's settings by name: the one place the process environment is read."""
    raw: dict[str, Any] = {}
    for name, var in ENV_VARS.items():
        value = env.get(var)
        if value is None or value == "":
            continue
        if name == "redact_patterns":
            raw[name] = _pattern_list(value)
        else:
            raw[name] = _split_list(value) if name in LIST_SETTINGS else value
    return raw


def _lists_from_strings(raw: dict[str, Any]) -> None:
    for name in LIST_SETTINGS:
        if isinstance(raw.get(name), str):
            raw[name] = _split_list(raw[name])
    if isinstance(raw.get("redact_patterns"), str):  # a single pattern in the file
        raw["redact_patterns"] = [raw["redact_patterns"]]


def _clusters(raw: dict[str, Any], env: Mapping[str, str]) -> list[str]:
    """VLLM_ONCALL_CLUSTERS parsed in `raw` (the first one named is the default); its problems."""
    if not raw.get("clusters"):
        return []
    raw["clusters"], problems = parse_clusters(raw["clusters"])
    if raw["clusters"] and not raw.get("cluster_name"):
        raw["cluster_name"] = next(iter(raw["clusters"]))
    if raw["clusters"] and raw.get("cluster_source", "kube") == "kube":
        problems.extend(missing_contexts(raw["clusters"], env))
    return problems


def parse_clusters(value: Any) -> tuple[dict[str, str], list[str]]:
    """VLLM_ONCALL_CLUSTERS: `NAME=CONTEXT,NAME=CONTEXT` (or, in the file, a mapping) -> the
    valid pairs, and one line per problem."""
    var = ENV_VARS["clusters"]
    if isinstance(value, Mapping):
        pairs = [(str(k), "" if v is None else str(v)) for k, v in value.items()]
    elif isinstance(value, str):
        pairs = [(n.strip(), c.strip()) if sep else (part, "") for part in _split_list(value)
                 for n, sep, c in [part.partition("=")]]
    else:
        return {}, [f"{var}: expected NAME=CONTEXT pairs, e.g. prod-eu=ctx-eu,prod-us=ctx-us"]
    out: dict[str, str] = {}
    problems = []
    for name, context in pairs:
        if not context:
            problems.append(f"{var}: {name!r} is not NAME=CONTEXT (a cluster name and its kubeconfig context)")
        elif not CLUSTER_NAME.fullmatch(name):
            problems.append(f"{var}: cluster name {name!r} must be a DNS label (lower-case letters, digits "
                            "and '-', at most 63 characters)")
        elif name in out:
            problems.append(f"{var}: cluster name {name!r} is given twice")
        else:
            out[name] = context
    return out, problems


def missing_contexts(clusters: Mapping[str, str], env: Mapping[str, str]) -> list[str]:
    """One line per cluster whose context is in no kubeconfig file (KUBECONFIG, else ~/.kube/config)."""
    var = ENV_VARS["clusters"]
    paths = [p for p in (env.get("KUBECONFIG") or "").split(os.pathsep) if p] or [str(Path.home() / ".kube" / "config")]
    known: list[str] = []
    for path in paths:
        try:
            doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue
        for entry in (doc.get("contexts") or []) if isinstance(doc, dict) else []:
            if isinstance(entry, dict) and entry.get("name"):
                known.append(str(entry["name"]))
    where = os.pathsep.join(paths)
    if not known:
        return [f"{var}: no kubeconfig with contexts at {where} (KUBECONFIG or ~/.kube/config)"]
    return [f"{var}: cluster {name}: context {context!r} is not in the kubeconfig {where} "
            f"(it has {', '.join(sorted(set(known)))})"
            for name, context in clusters.items() if context not in known]


def _describe(exc: ValidationError, raw: dict[str, Any]) -> list[str]:
    out = []
    for err in exc.errors():
        where = [str(part) for part in err["loc"]]
        # a grouped setting ("slack", "bot_token") is named by its flat name (slack_bot_token)
        loc = FLAT_NAME.get((where[0], where[1])) if len(where) > 1 else (where[0] if where else None)
        if loc is None:  # a model-level check: its message already names the variables
            out.extend(str(err["msg"]).removeprefix("Value error, ").split("; "))
            continue
        var = ENV_VARS.get(str(loc), str(loc))
        if err["type"] == "missing":
            out.append(f"{var}: required, not set")
        else:
            got = raw.get(str(loc))
            shown = "<hidden>" if any(word in str(loc) for word in ("token", "secret", "key")) else repr(got)
            got_part = "" if str(loc) == "redact_patterns" else f" (got {shown})"  # the message names it
            out.append(f"{var}: {str(err['msg']).removeprefix('Value error, ')}{got_part}")
    return out
