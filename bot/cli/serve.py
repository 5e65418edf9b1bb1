"""Terminal commands for the chat side: serve (Slack + HTTP) and demo (the bundled incident)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

from bot.app.ports import ClusterPort, IncidentStore
from bot.app.state import IncidentState
from bot.cli.books import add_option as add_playbooks_option

# The demo incident: inside an installed wheel (setup.py copies it to bot/_bundled/), else in the checkout.
EXAMPLE_DIRS = (Path(__file__).resolve().parents[1] / "_bundled" / "examples" / "incident",
                Path(__file__).resolve().parents[2] / "examples" / "incident")
DEMO_APPROVER = "U0DEMOAPPROVER"


def register(sub: argparse._SubParsersAction) -> None:
    """Add the serve/demo subcommands to the `vllm-oncall` parser."""
    serve = sub.add_parser("serve", help="run the Slack bot and the Alertmanager receiver",
                           description="Run the Slack bot (Socket Mode when SLACK_APP_TOKEN is set, else HTTP "
                                       "at /slack/events) and the HTTP server (/alerts, /healthz, /readyz, "
                                       "/metrics). Configuration: environment variables, see docs/slack.md.")
    serve.add_argument("--config", metavar="FILE", help="YAML file with settings (environment variables win)")
    serve.add_argument("--check", action="store_true", help="validate the configuration and exit")
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    serve.add_argument("--watch", action="store_true",
                       help="watch pods and diagnose a vLLM container at its first crash (VLLM_ONCALL_WATCH)")
    add_playbooks_option(serve)
    serve.set_defaults(func=run_serve)

    demo = sub.add_parser("demo", help="run the whole pipeline on the bundled example incident, no Slack or "
                                       "cluster needed",
                          description="Feed the bundled Alertmanager alert to the bot, diagnose the bundled "
                                      "evidence, and print the Slack message that would be posted.")
    demo.add_argument("--approve", action="store_true", help="also click Approve and show the apply path")
    demo.add_argument("--example", metavar="DIR", help="an example folder with alert.json and bundle/")
    demo.add_argument("--state-dir", metavar="DIR", help="where incidents and the patched manifest are kept "
                                                         "(default: a fresh temporary folder, removed after)")
    add_playbooks_option(demo)
    demo.set_defaults(func=run_demo)


# ---- demo ---------------------------------------------------------------------------------


def _example_dir(given: str | None) -> Path:
    if given:
        return Path(given)
    for folder in EXAMPLE_DIRS:
        if (folder / "alert.json").is_file():
            return folder
    raise FileNotFoundError("the bundled example incident is missing (examples/incident/alert.json)")


def run_demo(args: argparse.Namespace) -> int:
    from bot.cli.books import books_for

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        example = _example_dir(args.example)
    except FileNotFoundError as exc:
        print(f"vllm-oncall demo: {exc}", file=sys.stderr)
        return 2
    books = books_for(args)
    if args.state_dir:
        return _demo(example, Path(args.state_dir), args.approve, books, keep=True)
    # A fresh temporary folder per run, removed afterwards: the demo leaves nothing behind.
    with tempfile.TemporaryDirectory(prefix="vllm-oncall-demo-") as state:
        return _demo(example, Path(state), args.approve, books, keep=False)


def _demo(example: Path, state: Path, approve: bool, books, keep: bool) -> int:
    from bot.app.service import OncallService, Policy
    from bot.http.alerts import AlertIntake
    from bot.http.executor import InlineExecutor
    from bot.local.cluster import LocalCluster
    from bot.local.store import FolderIncidentStore
    from bot.slack.terminal import TerminalChat

    out = sys.stdout
    cluster = LocalCluster(example / "bundle", state / "cluster", name="demo-cluster", playbooks=books)
    store = FolderIncidentStore(state / "incidents")
    chat = TerminalChat(out, channel="#vllm-oncall")
    diagnose = _diagnoser(books)
    service = OncallService(cluster, store, chat, Policy(approver_users=frozenset({DEMO_APPROVER})),
                            **({"diagnose": diagnose} if diagnose else {}))
    intake = AlertIntake(service, InlineExecutor())  # inline: the output appears in order

    out.write(f"Alertmanager -> POST /alerts with {example / 'alert.json'}\n")
    status, answer = intake.receive((example / "alert.json").read_bytes(), None)
    out.write(f"the bot answered {status} {answer}\n")
    if status != 200:
        return 1
    incidents = store.list()
    if not incidents:
        out.write("no incident was opened (see the messages above)\n")
        return 1
    incident = incidents[0]
    if approve:
        if incident.state != IncidentState.PROPOSED:
            out.write(f"\nnothing to approve: the incident is {incident.state}\n")
        else:
            out.write(f"\n<@{DEMO_APPROVER}> clicks Approve and confirms\n")
            service.approve(incident.name, DEMO_APPROVER)
            _print_manifest_diff(example / "bundle", state / "cluster", out)
    kept = f"State kept in {state}" if keep else "Temporary state removed (--state-dir DIR keeps it)"
    final = store.get(incident.name) or incident
    out.write(f"\nIncident {incident.name}: {final.state}. {kept}\n")
    if not approve and incident.state == IncidentState.PROPOSED:
        out.write("Run `vllm-oncall demo --approve` to see the apply path.\n")
    return 0


def _diagnoser(books):
    """The core's diagnose with the given playbooks; None keeps the service's default."""
    if books is None:
        return None
    from bot.diagnosis.diagnose import diagnose

    return lambda evidence: diagnose(evidence, books)


def _print_manifest_diff(bundle: Path, cluster_state: Path, out) -> None:
    """The patched workload against the bundle's, as `kubectl diff` would show it: without the
    fields the API server sets (status, uid, resourceVersion, ...)."""
    import yaml

    from bot.cli.manifest import server_fields_removed, unified_diff

    for patched in sorted(cluster_state.glob("*.yaml")):
        if patched.name == "events.yaml":
            continue
        kind = str((yaml.safe_load(patched.read_text(encoding="utf-8")) or {}).get("kind", ""))
        original = bundle / f"{kind.lower()}.yaml"  # the bundle's deployment.yaml / statefulset.yaml
        if not original.is_file():
            continue
        before = server_fields_removed(original.read_text(encoding="utf-8"))
        after = server_fields_removed(patched.read_text(encoding="utf-8"))
        out.write(f"\nThe patched manifest ({original.name}, server-set fields left out):\n")
        out.write(unified_diff(before, after, f"a/{original.name}", f"b/{original.name}"))


# ---- serve --------------------------------------------------------------------------------


def run_serve(args: argparse.Namespace) -> int:
    from bot.cli.access import ClusterAccessError
    from bot.cli.settings import SettingsError, load_settings
    from bot.diagnosis.playbooks import PlaybookError

    logging.basicConfig(level=getattr(logging, args.log_level),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings(config_file=args.config, overrides=_overrides(args))
    except SettingsError as exc:
        print(f"vllm-oncall serve: {exc}", file=sys.stderr)
        return 2
    try:
        if args.check:  # everything first, so "OK" is never printed for a bot that cannot work
            checked = check_dependencies(settings)
            print(f"configuration OK: {_summary(settings)}\n{checked}")
            return 0
        server, socket_handler = build_server(settings)
    except (ClusterAccessError, PlaybookError, CheckFailed) as exc:
        print(f"vllm-oncall serve: {exc}", file=sys.stderr)
        return 2
    logging.getLogger(__name__).info("starting: %s", _summary(settings))
    # Kubernetes stops pods with SIGTERM: finish cleanly (the incidents are in the store anyway).
    signal.signal(signal.SIGTERM, lambda *_: server.request_stop())
    if socket_handler is not None:
        socket_handler.connect()  # returns at once; events arrive on its own threads
    server.serve_forever()
    if socket_handler is not None:
        socket_handler.close()
    return 0


def _overrides(args: argparse.Namespace) -> dict:
    """Command-line options that are settings too (they win over the environment)."""
    out: dict = {"playbooks": args.playbooks} if args.playbooks else {}
    if getattr(args, "watch", False):
        out["watch"] = True
    return out


def _summary(settings) -> str:
    mode = "Socket Mode" if settings.slack_app_token else f"HTTP (POST /slack/events on {settings.listen})"
    store_desc = (f"vllmincidents in namespace {settings.incident_namespace_or_default()}"
                  if settings.store == "kube" else f"folder {settings.state_dir / 'incidents'}")
    approvers = ", ".join(settings.approver_users + settings.approver_groups) or "none"
    return (f"{_clusters_summary(settings)}; mode {settings.mode}; Slack via {mode}, channel "
            f"{settings.slack_channel}; incidents: {store_desc}; approvers: {approvers}; "
            f"alerts: {', '.join(settings.alertnames)} on {settings.listen}/alerts"
            f"{' (bearer token required)' if settings.alert_token else ''}"
            f"{_watch_summary(settings)}")


def _clusters_summary(settings) -> str:
    if not settings.clusters:
        return f"cluster {settings.cluster_name}"
    served = ", ".join(f"{name} (context {context})" for name, context in settings.contexts.items())
    return (f"clusters {served}; default {settings.cluster_name}; alerts routed by their "
            f"{settings.cluster_label!r} label")


def _watch_summary(settings) -> str:
    if not settings.watch:
        return "; pod watch off (the alert path only)"
    scope = ", ".join(settings.watch_namespaces) or "all namespaces"
    selector = f" with {settings.watch_label_selector}" if settings.watch_label_selector else ""
    return f"; pod watch on: first crashes of vLLM containers in {scope}{selector}"


def verify_steps(settings, cluster):  # -> VerifySteps
    """Steps 3 and 4 of verification (a completion request, a soak) on a live cluster; a local
    one has no pods to ask, so it stops at Ready + KV-cache line."""
    from bot.app.rollout import VerifySteps

    probe = None
    if settings.cluster_source == "kube":
        from bot.kube.prometheus import Prometheus
        from bot.kube.verify import ServingChecks

        prometheus = Prometheus(settings.prometheus_url) if settings.prometheus_url else None
        probe = ServingChecks(cluster.api, via=settings.verify_request_via, prometheus=prometheus)
    return VerifySteps(probe=probe, request_timeout_seconds=settings.verify_request_timeout_seconds,
                       soak_seconds=settings.verify_soak_seconds)


def start_watch(settings, cluster, service):  # -> PodWatch | None
    """VLLM_ONCALL_WATCH: a pod watch whose crashes go the alert's way (service.handle_alert), so
    the later KubePodCrashLooping alert folds into the incident the watch opened. Daemon threads:
    they end with the process; the incidents are in the store."""
    if not settings.watch:
        return None
    from bot.kube.watch import PodWatch, WatchSettings, as_alert

    watch_settings = WatchSettings(namespaces=tuple(settings.watch_namespaces),
                                   label_selector=settings.watch_label_selector)
    watcher = PodWatch(cluster.api, lambda crash: service.handle_alert(as_alert(crash)), watch_settings)
    of = f" in cluster {cluster.name}" if settings.clusters else ""
    logging.getLogger(__name__).info("pod watch started%s%s", of,
                                     _watch_summary(settings).removeprefix("; pod watch on"))
    return watcher.start()


class CheckFailed(RuntimeError):
    """`serve --check`: the configuration is valid but something it names does not work."""


def check_dependencies(settings) -> str:
    """What `serve --check` checks past the settings: the playbooks load (bundled plus extra folders)
    and the cluster answers the calls the bot makes first. Slack is not called: /readyz does that."""
    from bot.cli.books import load_books
    from bot.diagnosis.playbooks import load_dir

    books = load_books(settings.playbooks) or load_dir()
    lines = [f"playbooks OK: {len(books)} ({', '.join(str(p) for p in settings.playbooks) or 'bundled only'})"]
    if settings.store == "kube" or settings.cluster_source == "kube":
        from bot.cli.access import api_client, check_reachable

        for name, context in settings.contexts.items():
            of = f" of cluster {name} (context {context})" if settings.clusters else ""
            client = api_client(context, kubeconfig_of(settings))
            check_reachable(client)
            cluster, store = _cluster_and_store(settings, books, client, name=name)
            try:
                kubernetes_answers(settings, cluster, store)
            except Exception as exc:  # one line whatever the client raised; the class names the kind
                raise CheckFailed(f"the Kubernetes API{of} refused the first calls: {_one_line_error(exc)}") from None
            lines.append(f"kubernetes OK{of.replace(' of', ':', 1) if of else ''}: the API server answers "
                         "and the bot may read what it needs")
    return "\n".join(lines)


def kubeconfig_of(settings) -> str | None:
    """Several clusters: the kubeconfig their contexts are in, read now (the kubernetes client
    reads KUBECONFIG once, at import). One cluster: None, so in a pod the service account is
    used as it always was."""
    return os.environ.get("KUBECONFIG") or None if settings.clusters else None


def _one_line_error(exc: Exception) -> str:
    """bot.kube's errors already say what failed ("forbidden: ... may not list vllmincidents")."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _cluster_and_store(settings, books, client=None, redactor=None, name: str | None = None
                       ) -> tuple[ClusterPort, IncidentStore]:
    """The ClusterPort and IncidentStore of cluster `name` (default: the default cluster) the
    settings name, one API client (its kubeconfig context) for both: a cluster's incidents are
    stored in that cluster."""
    cluster: ClusterPort
    store: IncidentStore
    from bot.local.store import FolderIncidentStore

    name = name or settings.cluster_name
    if client is None and (settings.cluster_source == "kube" or settings.store == "kube"):
        from bot.cli.access import api_client

        client = api_client(settings.contexts[name], kubeconfig_of(settings))
    if settings.cluster_source == "local":
        from bot.local.cluster import LocalCluster

        cluster = LocalCluster(settings.bundle_dir, settings.state_dir / "cluster", name=name, playbooks=books)
    else:
        from bot.kube.api import KubeApi
        from bot.kube.live import LiveCluster

        # A patch ends within half the apply grace; the applier starts it only while it can end
        # inside the grace (Policy.patch_seconds), so the sweep never takes over a patch in flight.
        cluster = LiveCluster(KubeApi(client, patch_within=patch_seconds(settings)), name=name, playbooks=books)
    if settings.store == "kube":
        from bot.kube.api import KubeApi
        from bot.kube.incidents import KubeIncidentStore

        store = KubeIncidentStore(KubeApi(client), settings.incident_namespace_or_default(),
                                  **({"redactor": redactor} if redactor else {}))
    else:
        store = FolderIncidentStore(settings.state_dir / "incidents", **({"redactor": redactor} if redactor else {}))
    return cluster, store


def count_kube_retries(metrics) -> None:
    """Every Kubernetes API retry (a 429 whose Retry-After was capped included: bot.kube.retry
    logs that) is counted in vllm_oncall_kube_retries_total on this server's /metrics."""
    from bot.kube.retry import on_retry

    on_retry(lambda what, status: metrics.kube_retries.inc())


def _diagnose_kw(books) -> dict:
    diagnose = _diagnoser(books)
    return {"diagnose": diagnose} if diagnose else {}


def _wire_commentary(service, metrics, redactor) -> None:
    """The optional LLM commentator (VLLM_ONCALL_LLM_BASE_URL): a reply in the thread after the
    diagnosis is posted, once per incident, never delaying the post, counted by outcome."""
    from bot.app.commentary import Commentary
    from bot.llm.wording import Commentator, LLMSettings

    try:
        llm = LLMSettings.from_env()
    except ValueError as exc:
        raise CheckFailed(str(exc)) from None
    if llm is None:
        return
    commentator = Commentator(llm, timeout_seconds=llm.timeout_seconds, calls_per_hour=llm.calls_per_hour,
                              redactor=redactor,
                              on_outcome=lambda outcome: metrics.llm_comments.labels(outcome).inc())
    service.intake.commentary = Commentary(commentator.comment, service.intake.messages)


def kubernetes_answers(settings, cluster, store) -> None:
    """For /readyz and `serve --check`: any answer from the API server will do; "no such pod" is one."""
    from bot.app.ports import PodNotFound

    if settings.store == "kube":
        store.list(cluster=cluster.name)
    elif settings.cluster_source == "kube":
        try:
            cluster.resolve_pod(settings.default_namespace, "vllm-oncall-readiness-check")
        except PodNotFound:
            pass


def build_server(settings):  # -> tuple[BotServer, SocketModeHandler | None]
    """Wire the real pieces from settings. Separate from run_serve so it can be reasoned about
    (and started) without a terminal. One OncallService per cluster served (VLLM_ONCALL_CLUSTERS,
    else the one cluster), sharing the chat, the policy and the metrics, behind one ClusterRouter."""
    from bot.app.metrics import Metrics
    from bot.app.router import ClusterRouter
    from bot.cli.books import load_books
    from bot.diagnosis.redact import Redactor
    from bot.http.server import BotServer
    from bot.slack.app import build_app
    from bot.slack.chat import SlackChat, make_client, post_budget

    metrics = Metrics()
    count_kube_retries(metrics)
    # One redactor (the built-in rules + VLLM_ONCALL_REDACT_PATTERNS) for every adapter whose text
    # leaves the cluster: the chat, the incident store, the LLM. Settings already validated them.
    redactor = Redactor(settings.redact_patterns)
    client = make_client(settings.slack_bot_token, settings.slack_api_url, timeout=settings.slack_timeout_seconds)
    # A post's retries end inside its post lease (Settings checked the timeout leaves room).
    chat = SlackChat(client, settings.slack_channel, metrics, max_attempts=settings.slack_max_attempts,
                     max_retry_after_seconds=settings.slack_max_retry_after_seconds, redactor=redactor,
                     post_budget_seconds=post_budget(settings.post_lease_seconds))
    books = load_books(settings.playbooks)  # None: the bundled playbooks, as always
    policy = _policy(settings, redactor)
    router = ClusterRouter([_cluster_service(settings, name, books, chat, policy, metrics, redactor)
                            for name in settings.contexts], default=settings.cluster_name)
    app = build_app(router, client, signing_secret=settings.slack_signing_secret,
                    token_verification_enabled=False, default_namespace=settings.default_namespace)
    host, port = settings.host_port
    server = BotServer(router, alert_token=settings.alert_token, alertnames=settings.alertnames,
                       workers=settings.workers, queue_size=settings.queue_size,
                       bolt_app=None if settings.slack_app_token else app,
                       readiness_checks={"slack": chat.check, **_kubernetes_checks(settings, router)},
                       host=host, port=port, sweep_interval=settings.sweep_interval_seconds,
                       cluster_label=settings.cluster_label)
    for service in router:  # one pod watch per cluster, stopped with the server
        watch = start_watch(settings, service.cluster, service)
        if watch is not None:
            server.on_stop.append(watch.stop)
    socket_handler = None
    if settings.slack_app_token:
        from slack_bolt.adapter.socket_mode import SocketModeHandler

        socket_handler = SocketModeHandler(app, settings.slack_app_token, ping_interval=settings.slack_ping_seconds)
    return server, socket_handler


def _policy(settings, redactor):  # -> Policy
    from bot.app.policy import parse_scopes
    from bot.app.service import Policy

    return Policy(approver_users=frozenset(settings.approver_users),
                  proposals_only=settings.mode == "proposals-only",
                  approver_groups=frozenset(settings.approver_groups),
                  approver_scopes=parse_scopes(settings.approver_scopes),
                  why_scope=settings.why_scope, alert_channel=settings.slack_channel,
                  proposal_ttl=timedelta(seconds=settings.proposal_ttl_seconds),
                  verify_timeout_seconds=settings.verify_timeout_seconds,
                  default_namespace=settings.default_namespace, redactor=redactor,
                  post_lease=timedelta(seconds=settings.post_lease_seconds),
                  apply_grace=timedelta(seconds=settings.apply_grace_seconds),
                  patch_seconds=patch_seconds(settings) if settings.cluster_source == "kube" else None)


def patch_seconds(settings) -> float:
    """The longest a workload patch may take with its retries: half the apply grace."""
    return settings.apply_grace_seconds / 2


def _cluster_service(settings, name, books, chat, policy, metrics, redactor):  # -> OncallService
    """Cluster `name`'s service: its ClusterPort and its IncidentStore (in that cluster)."""
    from bot.app.service import OncallService

    cluster, store = _cluster_and_store(settings, books, redactor=redactor, name=name)
    service = OncallService(cluster, store, chat, policy, metrics, **_diagnose_kw(books),
                            verify_steps=verify_steps(settings, cluster))
    _wire_commentary(service, metrics, redactor)
    return service


def _kubernetes_checks(settings, router) -> dict:
    """/readyz: every cluster's API answers ("kubernetes", or "kubernetes CLUSTER" for each of several)."""
    def check(service):
        return lambda: kubernetes_answers(settings, service.cluster, service.store)
    if len(router) == 1:
        return {"kubernetes": check(router.default)}
    return {f"kubernetes {service.cluster.name}": check(service) for service in router}
