"""The composition root of `vllm-oncall serve` (and the demo): every adapter built from the
settings, once, into one typed `Wiring`.

What is decided here, once, for every caller:
- `diagnose`: the core's diagnoser with the operator's playbooks (VLLM_ONCALL_PLAYBOOKS, or
  --playbooks). The intake, `/vllm why`, and the verification's re-diagnosis of a new pod
  that crashes (LiveCluster's rollout follow and the serving checks) all get this one.
- the one work queue, shared by the webhook and the pod watches (bot.app.work);
- the one retry counter: every Kubernetes and Slack retry is counted in Metrics.retries;
- the one redactor, for every adapter whose text leaves the cluster;
- the Policy, derived from the settings by `policy_of`.

This module imports the clients (slack_bolt, kubernetes, prometheus_client) at its top: the
command line loads it only when it serves (bot.cli.serve `_wiring`), so `vllm-oncall --help`
stays cheap.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from kubernetes import client as kube_client
from slack_bolt import App
from slack_bolt.adapter.socket_mode import SocketModeHandler
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.app.commentary import Commentary
from bot.app.links import LinkKind, LinkTemplates
from bot.app.metrics import Metrics
from bot.app.pacing import Pacer
from bot.app.policy import Policy
from bot.app.ports import ClusterPort, IncidentStore, PodNotFound
from bot.app.rehearsal import TEST_CLUSTER
from bot.app.rollout import VerifySteps
from bot.app.router import ClusterRouter
from bot.app.seal import derived_key
from bot.app.service import OncallService
from bot.app.work import InlineExecutor, WorkQueue
from bot.cli.access import api_client, check_reachable
from bot.cli.books import load_books
from bot.cli.examples import example_dir
from bot.cli.settings import Settings
from bot.cli.version import version
from bot.diagnosis.diagnose import diagnose as core_diagnose
from bot.diagnosis.models import DiagnosisResult, Evidence
from bot.diagnosis.playbooks import Playbook, load_dir
from bot.diagnosis.redact import Redactor
from bot.http.alerts import AlertIntake
from bot.http.server import BotServer
from bot.kube.api import KubeApi
from bot.kube.incidents import KubeIncidentStore
from bot.kube.live import LiveCluster
from bot.kube.prometheus import Prometheus, PrometheusTraffic
from bot.kube.verify import ServingChecks
from bot.kube.watch import PodWatch, WatchSettings
from bot.llm.wording import Commentator
from bot.local.cluster import LocalCluster
from bot.local.store import FolderIncidentStore
from bot.slack.app import build_app
from bot.slack.chat import SlackChat, make_client, post_budget
from bot.slack.ids import parse_scopes
from bot.slack.preflight import slack_problems
from bot.slack.socket_mode import patient
from bot.slack.terminal import TerminalChat
from bot.support.retrying import RetryPolicy

log = logging.getLogger("bot.cli.serve")
Diagnose = Callable[[Evidence], DiagnosisResult]


class CheckFailed(RuntimeError):
    """`serve --check`, or building the server: the configuration is valid but something it
    names does not work."""


def diagnoser(books: list[Playbook] | None) -> Diagnose:
    """The one diagnose every caller gets: the core's, with the operator's playbooks when any."""
    return core_diagnose if books is None else partial(core_diagnose, playbooks=books)


def patch_seconds(settings: Settings) -> float:
    """The longest a workload patch may take with its retries: half the apply grace."""
    return settings.apply_grace_seconds / 2


def policy_of(settings: Settings, redactor: Redactor) -> Policy:
    """The application's policy, derived from the settings in this one place."""
    return Policy(approver_users=frozenset(settings.approver_users),
                  proposals_only=settings.mode == "proposals-only",
                  approver_groups=frozenset(settings.approver_groups),
                  approver_scopes=parse_scopes(settings.approver_scopes),
                  why_scope=settings.why_scope, alert_channel=settings.slack.channel,
                  proposal_ttl=timedelta(seconds=settings.proposal_ttl_seconds),
                  verify_timeout_seconds=settings.verify.timeout_seconds,
                  default_namespace=settings.default_namespace, redactor=redactor,
                  post_lease=timedelta(seconds=settings.post_lease_seconds),
                  apply_grace=timedelta(seconds=settings.apply_grace_seconds),
                  patch_seconds=patch_seconds(settings) if settings.cluster_source == "kube" else None,
                  links=LinkTemplates({LinkKind.RUNBOOK: settings.runbook_url,
                                       LinkKind.DASHBOARD: settings.dashboard_url}),
                  seal_key=derived_key(settings.seal_key or settings.slack.bot_token),
                  group_storms=settings.slack.pace.post_interval > 0)


def kubeconfig_of(settings: Settings) -> str | None:
    """Several clusters: the kubeconfig their contexts are in, read now (the kubernetes client
    reads KUBECONFIG once, at import). One cluster: None, so in a pod the service account is
    used as it always was."""
    return os.environ.get("KUBECONFIG") or None if settings.clusters else None


@dataclass
class ClusterWiring:
    """One served cluster: its ports, its service, and its pod watch (VLLM_ONCALL_WATCH)."""

    name: str
    cluster: ClusterPort
    store: IncidentStore
    service: OncallService
    watch: PodWatch | None = None


@dataclass
class Wiring:
    """Everything `serve` runs, built once by `build`."""

    settings: Settings
    metrics: Metrics
    redactor: Redactor
    books: list[Playbook] | None
    diagnose: Diagnose
    policy: Policy
    slack: WebClient
    chat: SlackChat
    work: WorkQueue
    clusters: list[ClusterWiring]
    router: ClusterRouter
    bolt_app: App
    server: BotServer
    socket_handler: SocketModeHandler | None = None
    watches: list[PodWatch] = field(default_factory=list)


class Parts:
    """Builds one cluster's parts from the settings; shared by `build` and `serve --check`."""

    def __init__(self, settings: Settings, books: list[Playbook] | None, diagnose: Diagnose,
                 metrics: Metrics, redactor: Redactor | None = None):
        self.settings, self.books, self.diagnose, self.metrics = settings, books, diagnose, metrics
        self.redactor = redactor

    def api(self, client: kube_client.ApiClient, patch_within: float | None = None) -> KubeApi:
        """Every Kubernetes call retried by the one policy and counted in the one counter."""
        return KubeApi(client, retry=RetryPolicy(count=self.metrics.count_retry), patch_within=patch_within)

    def client(self, name: str) -> kube_client.ApiClient | None:
        s = self.settings
        if s.cluster_source != "kube" and s.store != "kube":
            return None
        return api_client(s.contexts[name], kubeconfig_of(s))

    def cluster(self, name: str, client: kube_client.ApiClient | None) -> ClusterPort:
        s = self.settings
        if s.cluster_source == "local":
            assert s.bundle_dir is not None  # Settings refuses a local cluster without a bundle
            return LocalCluster(s.bundle_dir, s.state_dir / "cluster", name=name, playbooks=self.books)
        assert client is not None
        # A patch ends within half the apply grace; the applier starts it only while it can end
        # inside the grace (Policy.patch_seconds), so the sweep never takes over a patch in flight.
        return LiveCluster(self.api(client, patch_within=patch_seconds(s)), name=name, playbooks=self.books,
                           diagnose=self.diagnose)

    def store(self, client: kube_client.ApiClient | None) -> IncidentStore:
        s = self.settings
        redactor: dict[str, Any] = {"redactor": self.redactor} if self.redactor else {}
        if s.store == "kube":
            assert client is not None
            return KubeIncidentStore(self.api(client), s.incident_namespace_or_default(), **redactor)
        return FolderIncidentStore(s.state_dir / "incidents", **redactor)

    def traffic(self) -> PrometheusTraffic | None:
        """vLLM's request histograms, from the Prometheus that verification reads GPU memory from."""
        url = self.settings.verify.prometheus_url
        return PrometheusTraffic(Prometheus(url)) if url else None

    def verify_steps(self, cluster: ClusterPort) -> VerifySteps:
        """Steps 3 and 4 of verification (a completion request, a soak) on a live cluster, a new
        crash re-diagnosed with the operator's playbooks; a local cluster has no pods to ask, so
        it stops at Ready + KV-cache line."""
        s = self.settings
        probe = None
        if isinstance(cluster, LiveCluster):
            prometheus = Prometheus(s.verify.prometheus_url) if s.verify.prometheus_url else None
            probe = ServingChecks(cluster.api, via=s.verify.request_via, prometheus=prometheus,
                                  diagnose=self.diagnose)
        return VerifySteps(probe=probe, request_timeout_seconds=s.verify.request_timeout_seconds,
                           soak_seconds=s.verify.soak_seconds)


@dataclass(frozen=True)
class ChatClock:
    """The clock the chat's pacing and retries wait on: the real one, or a test's virtual clock
    shared with the Slack stand-in (so a 300-crash storm is paced without waiting 10 minutes)."""

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def paced_chat(settings: Settings, slack: WebClient, metrics: Metrics, redactor: Redactor,
               clock: ChatClock | None = None) -> SlackChat:
    """The chat `serve` posts through: paced (bot.app.pacing; Slack's posting rate unless
    VLLM_ONCALL_SLACK_POST_INTERVAL / _UPDATE_INTERVAL say otherwise), its
    retries honouring Retry-After, a post's retries ending inside its post lease (Settings
    checked the timeout leaves room)."""
    clock = clock or ChatClock()
    return SlackChat(slack, settings.slack.channel, metrics, max_attempts=settings.slack.max_attempts,
                     max_retry_after_seconds=settings.slack.max_retry_after_seconds, redactor=redactor,
                     post_budget_seconds=post_budget(settings.post_lease_seconds), clock=clock.now,
                     sleep=clock.sleep, pacer=Pacer(settings.slack.pace, clock=clock.now, sleep=clock.sleep))


def build(settings: Settings, clock: ChatClock | None = None) -> Wiring:
    """Wire the real pieces from settings. One OncallService per cluster served
    (VLLM_ONCALL_CLUSTERS, else the one cluster), sharing the chat, the policy, the metrics,
    the diagnoser and the work queue, behind one ClusterRouter."""
    refusal = settings.http.alert_auth_refusal()
    if refusal:  # before anything listens: an open /alerts must be the operator's explicit choice
        raise CheckFailed(refusal)
    if settings.http.alert_auth_warning():
        log.warning("%s", settings.http.alert_auth_warning())
    metrics = Metrics()
    metrics.build_info.labels(version()).set(1)
    # One redactor (the built-in rules + VLLM_ONCALL_REDACT_PATTERNS) for every adapter whose text
    # leaves the cluster: the chat, the incident store, the LLM. Settings already validated them.
    redactor = Redactor(settings.redact_patterns)
    books = load_books(settings.playbooks)  # None: the bundled playbooks, as always
    diagnose = diagnoser(books)
    policy = policy_of(settings, redactor)
    slack = make_client(settings.slack.bot_token, settings.slack.api_url, timeout=settings.slack.timeout_seconds)
    chat = paced_chat(settings, slack, metrics, redactor, clock)
    commentary = _commentary(settings, metrics, redactor)
    parts = Parts(settings, books, diagnose, metrics, redactor)
    clusters = []
    for name in settings.contexts:
        client = parts.client(name)
        cluster, store = parts.cluster(name, client), parts.store(client)
        service = OncallService(cluster, store, chat, policy, metrics, diagnose=diagnose,
                                verify_steps=parts.verify_steps(cluster), traffic=parts.traffic())
        if commentary is not None:
            service.intake.commentary = Commentary(commentary, service.intake.messages)
        clusters.append(ClusterWiring(name, cluster, store, service))
    router = ClusterRouter([c.service for c in clusters], default=settings.cluster_name)
    work = WorkQueue(settings.http.workers, settings.http.queue_size)
    bolt_app = build_app(router, slack, signing_secret=settings.slack.signing_secret,
                         token_verification_enabled=False, default_namespace=settings.default_namespace,
                         post_test_incident=lambda channel: post_test_incident(settings, channel, books, metrics)[1])
    host, port = settings.http.host_port
    server = BotServer(router, alert_token=settings.http.alert_token, alertnames=settings.http.alertnames, work=work,
                       bolt_app=None if settings.slack.app_token else bolt_app,
                       readiness_checks={"slack": chat.check, **_kubernetes_checks(settings, clusters)},
                       host=host, port=port, sweep_interval=settings.sweep_interval_seconds,
                       cluster_label=settings.cluster_label)
    server.readiness.vetoes["slack"] = chat.refused  # a revoked token, not in the channel: 503 with the fix
    server.on_stop.append(chat.close)  # a details reply or a retry left waiting sends nothing after the stop
    wiring = Wiring(settings=settings, metrics=metrics, redactor=redactor, books=books, diagnose=diagnose,
                    policy=policy, slack=slack, chat=chat, work=work, clusters=clusters, router=router,
                    bolt_app=bolt_app, server=server)
    for each in clusters:  # one pod watch per cluster, into the one work queue, stopped with the server
        each.watch = _start_watch(settings, each, router, work)
        if each.watch is not None:
            wiring.watches.append(each.watch)
            server.on_stop.append(each.watch.stop)
    if settings.slack.app_token:
        wiring.socket_handler = patient(SocketModeHandler(bolt_app, settings.slack.app_token,
                                                          ping_interval=settings.slack.ping_seconds))
    return wiring


@dataclass
class Demo:
    """`vllm-oncall demo`: the bundled incident as a local cluster, a folder store, a terminal chat."""

    service: OncallService
    store: IncidentStore
    intake: AlertIntake


def build_demo(bundle: Path, state: Path, books: list[Playbook] | None, out: TextIO, approver: str) -> Demo:
    cluster = LocalCluster(bundle, state / "cluster", name="demo-cluster", playbooks=books)
    store = FolderIncidentStore(state / "incidents")
    chat = TerminalChat(out, channel="#vllm-oncall")
    service = OncallService(cluster, store, chat, Policy(approver_users=frozenset({approver})),
                            diagnose=diagnoser(books))
    return Demo(service, store, AlertIntake(service, InlineExecutor()))  # inline: the output appears in order


TEST_THREAD_NOTE = ("Test incident from `vllm-oncall test-incident` / `/vllm test`: the bundled example, "
                    "diagnosed on a local copy of its evidence. Its buttons answer and change nothing; no pod "
                    "crashed and nobody was paged.")


def post_test_incident(settings: Settings, channel: str, books: list[Playbook] | None = None,
                       metrics: Metrics | None = None) -> tuple[bool, str]:
    """The test incident (bot.app.rehearsal): the bundled example alert through the real intake,
    diagnosis and Slack post, against a LocalCluster of the bundled evidence in a temporary
    folder, under the reserved cluster name whose clicks change nothing. (posted?, one line)."""
    redactor = Redactor(settings.redact_patterns)
    books = books if books is not None else load_books(settings.playbooks)
    slack = make_client(settings.slack.bot_token, settings.slack.api_url, timeout=settings.slack.timeout_seconds)
    chat = SlackChat(slack, channel, metrics or Metrics(), max_attempts=settings.slack.max_attempts,
                     max_retry_after_seconds=settings.slack.max_retry_after_seconds, redactor=redactor)
    policy = replace(policy_of(settings, redactor), alert_channel=channel)
    example = example_dir()
    with tempfile.TemporaryDirectory(prefix="vllm-oncall-test-") as state:
        cluster = LocalCluster(example / "bundle", Path(state) / "cluster", name=TEST_CLUSTER, playbooks=books)
        store = FolderIncidentStore(Path(state) / "incidents")
        service = OncallService(cluster, store, chat, policy, diagnose=diagnoser(books))
        status, answer = AlertIntake(service, InlineExecutor()).receive((example / "alert.json").read_bytes(), None)
        posted = [i for i in store.list() if i.message_id]
    if status != 200 or not posted:
        return False, (f"the test incident was not posted to {channel} (intake answered {status} {answer}); "
                       "the log lines above say why")
    incident = posted[0]
    try:
        slack.chat_postMessage(channel=incident.chat_channel or channel, thread_ts=incident.message_id,
                               text=TEST_THREAD_NOTE)
    except (SlackApiError, OSError) as exc:  # the incident is posted; the note is a courtesy
        log.warning("test incident posted, but its thread note was not: %s", exc)
    return True, (f"posted test incident {incident.name} ({incident.cause}) to {channel}: its buttons answer "
                  "that it is a test and change nothing")


def build_server(settings: Settings, clock: ChatClock | None = None) -> tuple[BotServer, SocketModeHandler | None]:
    wiring = build(settings, clock)
    return wiring.server, wiring.socket_handler


def _commentary(settings: Settings, metrics: Metrics, redactor: Redactor) -> Callable[..., Any] | None:
    """The optional LLM commentator (VLLM_ONCALL_LLM_BASE_URL): a reply in the thread after the
    diagnosis is posted, once per incident, never delaying the post, counted by outcome."""
    llm = settings.llm.endpoint()
    if llm is None:
        return None
    commentator = Commentator(llm, timeout_seconds=llm.timeout_seconds, calls_per_hour=llm.calls_per_hour,
                              redactor=redactor, on_outcome=lambda outcome: metrics.llm_comments.labels(outcome).inc())
    return commentator.comment


def watch_summary(settings: Settings) -> str:
    if not settings.watch.enabled:
        return "; pod watch off (the alert path only)"
    scope = ", ".join(settings.watch.namespaces) or "all namespaces"
    selector = f" with {settings.watch.label_selector}" if settings.watch.label_selector else ""
    return f"; pod watch on: first crashes of vLLM containers in {scope}{selector}"


def _start_watch(settings: Settings, each: ClusterWiring, router: ClusterRouter, work: WorkQueue) -> PodWatch | None:
    """VLLM_ONCALL_WATCH: a pod watch whose crashes go into the one work queue the alert's way
    (router.handle_alert), so the later KubePodCrashLooping alert folds into the incident the
    watch opened. Daemon threads: they end with the process; the incidents are in the store."""
    if not settings.watch.enabled or not isinstance(each.cluster, LiveCluster):
        return None
    watch_settings = WatchSettings(namespaces=tuple(settings.watch.namespaces),
                                   label_selector=settings.watch.label_selector)
    watcher = PodWatch(each.cluster.api, work, router.handle_alert, watch_settings,
                       cluster=each.name if len(router) > 1 else None)
    of = f" in cluster {each.name}" if settings.clusters else ""
    log.info("pod watch started%s%s", of, watch_summary(settings).removeprefix("; pod watch on"))
    return watcher.start()


def kubernetes_answers(settings: Settings, cluster: ClusterPort, store: IncidentStore) -> None:
    """For /readyz and `serve --check`: any answer from the API server will do; "no such pod" is one."""
    if settings.store == "kube":
        store.list(cluster=cluster.name)
    elif settings.cluster_source == "kube":
        try:
            cluster.resolve_pod(settings.default_namespace, "vllm-oncall-readiness-check")
        except PodNotFound:
            pass


def _kubernetes_checks(settings: Settings, clusters: list[ClusterWiring]) -> dict[str, Callable[[], None]]:
    """/readyz: every cluster's API answers ("kubernetes", or "kubernetes CLUSTER" for each of several)."""
    def check(each: ClusterWiring) -> Callable[[], None]:
        return lambda: kubernetes_answers(settings, each.cluster, each.store)
    if len(clusters) == 1:
        return {"kubernetes": check(clusters[0])}
    return {f"kubernetes {each.name}": check(each) for each in clusters}


def check_dependencies(settings: Settings, offline: bool = False) -> str:
    """What `serve --check` checks past the settings: the playbooks load (bundled plus extra folders),
    the cluster answers the calls the bot makes first and, unless `offline`, Slack accepts the
    token, its scopes and the bot's membership of the channel (bot.slack.preflight)."""
    refusal = settings.http.alert_auth_refusal()
    if refusal:
        raise CheckFailed(refusal)
    books = load_books(settings.playbooks)
    lines = [f"playbooks OK: {len(books or load_dir())} "
             f"({', '.join(str(p) for p in settings.playbooks) or 'bundled only'})"]
    if not offline:
        slack = make_client(settings.slack.bot_token, settings.slack.api_url, timeout=settings.slack.timeout_seconds)
        problems = slack_problems(slack, settings.slack.channel, slack.base_url)
        if problems:
            raise CheckFailed("Slack: " + "\nvllm-oncall serve: Slack: ".join(problems))
        lines.append(f"slack OK: the token works, has the scopes the bot uses, and the bot is in "
                     f"{settings.slack.channel}")
    if settings.store == "kube" or settings.cluster_source == "kube":
        parts = Parts(settings, books, diagnoser(books), Metrics())
        for name, context in settings.contexts.items():
            of = f" of cluster {name} (context {context})" if settings.clusters else ""
            client = api_client(context, kubeconfig_of(settings))
            check_reachable(client)
            cluster, store = parts.cluster(name, client), parts.store(client)
            try:
                kubernetes_answers(settings, cluster, store)
            except Exception as exc:  # one line whatever the client raised; the class names the kind
                raise CheckFailed(f"the Kubernetes API{of} refused the first calls: {_one_line_error(exc)}") from None
            lines.append(f"kubernetes OK{of.replace(' of', ':', 1) if of else ''}: the API server answers "
                         "and the bot may read what it needs")
    return "\n".join(lines)


def _one_line_error(exc: Exception) -> str:
    """bot.kube's errors already say what failed ("forbidden: ... may not list vllmincidents")."""
    return " ".join(str(exc).split()) or type(exc).__name__
