"""Terminal commands for the chat side: serve (Slack + HTTP) and demo (the bundled incident)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_DIRS = (REPO_ROOT / "examples" / "incident", Path(__file__).resolve().parents[1] / "examples" / "incident")
DEMO_APPROVER = "U0DEMOAPPROVER"


def register(sub: "argparse._SubParsersAction") -> None:
    """Add the serve/demo subcommands to the `vllm-oncall` parser."""
    serve = sub.add_parser("serve", help="run the Slack bot and the Alertmanager receiver",
                           description="Run the Slack bot (Socket Mode when SLACK_APP_TOKEN is set, else HTTP "
                                       "at /slack/events) and the HTTP server (/alerts, /healthz, /readyz, "
                                       "/metrics). Configuration: environment variables, see docs/slack.md.")
    serve.add_argument("--config", metavar="FILE", help="YAML file with settings (environment variables win)")
    serve.add_argument("--check", action="store_true", help="validate the configuration and exit")
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    serve.set_defaults(func=run_serve)

    demo = sub.add_parser("demo", help="run the whole pipeline on the bundled example incident, no Slack or "
                                       "cluster needed",
                          description="Feed the bundled Alertmanager alert to the bot, diagnose the bundled "
                                      "evidence, and print the Slack message that would be posted.")
    demo.add_argument("--approve", action="store_true", help="also click Approve and show the apply path")
    demo.add_argument("--example", metavar="DIR", help="an example folder with alert.json and bundle/")
    demo.add_argument("--state-dir", metavar="DIR", help="where incidents and the patched manifest are kept "
                                                         "(default: a fresh temporary folder)")
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
    from bot.local.store import FolderIncidentStore
    from bot.local.cluster import LocalCluster
    from bot.http.alerts import AlertIntake
    from bot.http.executor import InlineExecutor
    from bot.app.service import OncallService, Policy
    from bot.slack.terminal import TerminalChat

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        example = _example_dir(args.example)
    except FileNotFoundError as exc:
        print(f"vllm-oncall demo: {exc}", file=sys.stderr)
        return 2
    state = Path(args.state_dir) if args.state_dir else Path(tempfile.mkdtemp(prefix="vllm-oncall-demo-"))
    out = sys.stdout
    cluster = LocalCluster(example / "bundle", state / "cluster", name="demo-cluster")
    store = FolderIncidentStore(state / "incidents")
    chat = TerminalChat(out, channel="#vllm-oncall")
    service = OncallService(cluster, store, chat, Policy(approver_users=frozenset({DEMO_APPROVER})))
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
    if args.approve:
        if incident.state != "proposed":
            out.write(f"\nnothing to approve: the incident is {incident.state}\n")
        else:
            out.write(f"\n<@{DEMO_APPROVER}> clicks Approve and confirms\n")
            service.approve(incident.name, DEMO_APPROVER)
    out.write(f"\nIncident {incident.name}: {store.get(incident.name).state}. State kept in {state}\n")
    if not args.approve and incident.state == "proposed":
        out.write("Run `vllm-oncall demo --approve` to see the apply path.\n")
    return 0


# ---- serve --------------------------------------------------------------------------------


def run_serve(args: argparse.Namespace) -> int:
    from bot.cli.settings import SettingsError, load_settings

    logging.basicConfig(level=getattr(logging, args.log_level),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings(config_file=args.config)
    except SettingsError as exc:
        print(f"vllm-oncall serve: {exc}", file=sys.stderr)
        return 2
    mode = "Socket Mode" if settings.slack_app_token else f"HTTP (POST /slack/events on {settings.listen})"
    store_desc = (f"vllmincidents in namespace {settings.incident_namespace_or_default()}"
                  if settings.store == "kube" else f"folder {settings.state_dir / 'incidents'}")
    summary = (f"cluster {settings.cluster_name}; Slack via {mode}, channel {settings.slack_channel}; "
               f"incidents: {store_desc}; approvers: {', '.join(settings.approver_users + settings.approver_groups)}; "
               f"alerts: {', '.join(settings.alertnames)} on {settings.listen}/alerts"
               f"{' (bearer token required)' if settings.alert_token else ''}")
    if args.check:
        print(f"configuration OK: {summary}")
        return 0
    server, socket_handler = build_server(settings)
    logging.getLogger(__name__).info("starting: %s", summary)
    # Kubernetes stops pods with SIGTERM: finish cleanly (the incidents are in the store anyway).
    signal.signal(signal.SIGTERM, lambda *_: server.request_stop())
    if socket_handler is not None:
        socket_handler.connect()  # returns at once; events arrive on its own threads
    server.serve_forever()
    if socket_handler is not None:
        socket_handler.close()
    return 0


def build_server(settings):  # -> tuple[BotServer, SocketModeHandler | None]
    """Wire the real pieces from settings. Separate from run_serve so it can be reasoned about
    (and started) without a terminal."""
    from bot.local.store import FolderIncidentStore
    from bot.kube.incidents import KubeIncidentStore
    from bot.kube.retry import on_retry
    from bot.app.ports import PodNotFound
    from bot.http.server import BotServer
    from bot.app.metrics import Metrics
    from bot.app.service import OncallService, Policy
    from bot.slack.app import build_app
    from bot.slack.chat import SlackChat, make_client

    metrics = Metrics()
    on_retry(lambda what, status: metrics.kube_retries.inc())
    client = make_client(settings.slack_bot_token, settings.slack_api_url)
    chat = SlackChat(client, settings.slack_channel, metrics, max_attempts=settings.slack_max_attempts,
                     max_retry_after_seconds=settings.slack_max_retry_after_seconds)
    if settings.cluster_source == "local":
        from bot.local.cluster import LocalCluster

        cluster = LocalCluster(settings.bundle_dir, settings.state_dir / "cluster", name=settings.cluster_name)
    else:
        from bot.kube.live import LiveCluster

        cluster = LiveCluster.from_environment(name=settings.cluster_name, context=settings.kube_context)
    if settings.store == "kube":
        store = KubeIncidentStore.from_environment(settings.incident_namespace_or_default(), settings.kube_context)
    else:
        store = FolderIncidentStore(settings.state_dir / "incidents")
    policy = Policy(approver_users=frozenset(settings.approver_users),
                    approver_groups=frozenset(settings.approver_groups),
                    proposal_ttl=timedelta(seconds=settings.proposal_ttl_seconds),
                    verify_timeout_seconds=settings.verify_timeout_seconds,
                    default_namespace=settings.default_namespace)
    from bot.llm.wording import LLMSettings, with_llm_wording

    service = OncallService(cluster, store, chat, policy, metrics, diagnose=with_llm_wording(LLMSettings.from_env()))

    def kubernetes_answers() -> None:
        if settings.store == "kube":
            store.list(cluster=settings.cluster_name)
        elif settings.cluster_source == "kube":
            try:  # any answer from the API server will do; "no such pod" is one
                cluster.resolve_pod(settings.default_namespace, "vllm-oncall-readiness-check")
            except PodNotFound:
                pass

    app = build_app(service, client, signing_secret=settings.slack_signing_secret,
                    token_verification_enabled=False, default_namespace=settings.default_namespace)
    host, port = settings.host_port
    server = BotServer(service, alert_token=settings.alert_token, alertnames=settings.alertnames,
                       workers=settings.workers, queue_size=settings.queue_size,
                       bolt_app=None if settings.slack_app_token else app,
                       readiness_checks={"slack": chat.check,
                                         "kubernetes": kubernetes_answers},
                       host=host, port=port, sweep_interval=settings.sweep_interval_seconds)
    socket_handler = None
    if settings.slack_app_token:
        from slack_bolt.adapter.socket_mode import SocketModeHandler

        socket_handler = SocketModeHandler(app, settings.slack_app_token)
    return server, socket_handler
