"""The bot's own Prometheus counters."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from bot.support.retrying import RetryEvent


class Metrics:
    """The bot's own counters, on a registry of its own (one per server, so tests don't clash)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # 1, labelled with the running version (set by the composition root, bot.cli.wiring).
        self.build_info = Gauge("vllm_oncall_build_info", "The running vllm-oncall's version", ["version"], registry=r)
        self.alerts_received = Counter("vllm_oncall_alerts_received", "Alerts received from Alertmanager",
                                       ["status"], registry=r)
        self.alerts_skipped = Counter("vllm_oncall_alerts_skipped", "Alerts not acted on", ["reason"], registry=r)
        self.diagnoses = Counter("vllm_oncall_diagnoses", "New incidents by diagnosed cause", ["cause"], registry=r)
        self.refused_renders = Counter("vllm_oncall_refused_renders", "Incident messages not rendered: the "
                                       "incident object's text was edited since the bot sealed it", registry=r)
        self.proposals = Counter("vllm_oncall_proposals", "Proposals offered with an Approve button", registry=r)
        # Each incident's message once: posted, or found in the channel's history after an ambiguous
        # answer or a restart (those are also counted in posts_recovered).
        self.incidents_posted = Counter("vllm_oncall_incidents_posted", "Incident messages posted (once per message)",
                                        registry=r)
        self.posts_recovered = Counter("vllm_oncall_posts_recovered",
                                       "Incident messages found in the channel's history instead of posted again "
                                       "(an earlier attempt's answer was lost)", registry=r)
        self.repeats = Counter("vllm_oncall_alert_repeats", "Alerts folded into an existing incident", registry=r)
        self.approvals = Counter("vllm_oncall_approvals", "Approve clicks that started a patch", registry=r)
        self.rejections = Counter("vllm_oncall_rejections", "Proposals rejected", registry=r)
        self.refused_clicks = Counter("vllm_oncall_refused_clicks", "Clicks that did nothing", ["reason"], registry=r)
        self.patches_applied = Counter("vllm_oncall_patches_applied", "Patches applied", registry=r)
        self.patches_failed = Counter("vllm_oncall_patches_failed", "Patches refused or failed", ["reason"],
                                      registry=r)
        self.rollbacks = Counter("vllm_oncall_rollbacks", "Rollbacks applied", registry=r)
        self.expired = Counter("vllm_oncall_proposals_expired", "Proposals that expired unused", registry=r)
        # Every retry of a call to a remote API, whichever adapter made it (bot.support.retrying).
        self.retries = Counter("vllm_oncall_retries", "Calls to a remote API retried", ["api", "call", "reason"],
                               registry=r)
        self.slack_failures = Counter("vllm_oncall_slack_failures", "Slack Web API calls that failed for good",
                                      ["method"], registry=r)
        self.slack_refusals = Counter("vllm_oncall_slack_refusals", "Slack answers that stop the bot until fixed "
                                      "(not_in_channel, invalid_auth, ...), by error", ["error"], registry=r)
        # The webhook and the HTTP server (bot.http): every request answered with an error, by a
        # fixed reason word; every alert of an accepted batch, by what became of it.
        self.http_rejected = Counter("vllm_oncall_http_rejected", "HTTP requests answered with an error, by reason",
                                     ["reason"], registry=r)
        self.webhook_alerts = Counter("vllm_oncall_webhook_alerts",
                                      "Alerts of accepted webhook batches: queued (new work item), folded (into a "
                                      "pending item), duplicate (same pod already pending)", ["outcome"], registry=r)
        self.alert_work_items = Counter("vllm_oncall_alert_work_items", "Work items queued (at most one per workload "
                                        "while there is room)", registry=r)
        # The optional LLM commentator (bot.llm): posted, dropped (failed the checks), timeout, error,
        # over_budget, repeat (this incident was commented on already).
        self.llm_comments = Counter("vllm_oncall_llm_comments", "LLM commentary attempts by outcome", ["outcome"],
                                    registry=r)
        self.alert_to_post = Histogram("vllm_oncall_alert_to_post_seconds",
                                       "From alert received to incident message posted",
                                       buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300), registry=r)

    def count_retry(self, event: RetryEvent) -> None:
        """The one retry counter (RetryPolicy.count): every adapter's retries, by API, call and reason."""
        self.retries.labels(event.api, event.call, event.reason).inc()
