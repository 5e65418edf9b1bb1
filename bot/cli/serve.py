"""Terminal commands for the chat side: serve (Slack + HTTP) and demo (the bundled incident)."""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from bot.cli.books import add_option as add_playbooks_option
from bot.cli.books import books_for
from bot.cli.version import version

if TYPE_CHECKING:  # the rest is imported by serve and demo when they run, not by `--help` (issue 20)
    from bot.cli.settings import Settings
    from bot.diagnosis.playbooks import Playbook

DEMO_APPROVER = "U0DEMOAPPROVER"


def register(sub: argparse._SubParsersAction) -> None:
    """Add the serve/demo subcommands to the `vllm-oncall` parser."""
    serve = sub.add_parser("serve", help="run the Slack bot and the Alertmanager receiver",
                           description="Run the Slack bot (Socket Mode when SLACK_APP_TOKEN is set, else HTTP "
                                       "at /slack/events) and the HTTP server (/alerts, /healthz, /readyz, "
                                       "/metrics). Configuration: environment variables, see docs/slack.md.")
    serve.add_argument("--config", metavar="FILE", help="YAML file with settings (environment variables win)")
    serve.add_argument("--check", action="store_true", help="validate the configuration, ask Slack and the "
                       "cluster the first questions, and exit")
    serve.add_argument("--offline", action="store_true", help="with --check: do not call Slack")
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

    test = sub.add_parser("test-incident", help="post a test incident (the bundled example) to the Slack channel",
                          description="Post the bundled example incident to the configured Slack channel, "
                                      "labelled as a test: its buttons answer that it is a test and change "
                                      "nothing; no pod crashes and nobody is paged. Same settings as serve.")
    test.add_argument("--config", metavar="FILE", help="YAML file with settings (environment variables win)")
    test.add_argument("--channel", help="post here instead of VLLM_ONCALL_SLACK_CHANNEL")
    test.set_defaults(func=run_test_incident)


# ---- demo ---------------------------------------------------------------------------------


def run_demo(args: argparse.Namespace) -> int:
    import tempfile  # here, not for every command: it brings shutil, bz2, lzma, random (issue 20)

    from bot.cli.examples import example_dir

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        example = example_dir(args.example)
    except FileNotFoundError as exc:
        print(f"vllm-oncall demo: {exc}", file=sys.stderr)
        return 2
    books = books_for(args)
    if args.state_dir:
        return _demo(example, Path(args.state_dir), args.approve, books, keep=True)
    # A fresh temporary folder per run, removed afterwards: the demo leaves nothing behind.
    with tempfile.TemporaryDirectory(prefix="vllm-oncall-demo-") as state:
        return _demo(example, Path(state), args.approve, books, keep=False)


def _demo(example: Path, state: Path, approve: bool, books: list[Playbook] | None, keep: bool) -> int:
    from bot.app.state import IncidentState

    out = sys.stdout
    demo = _wiring().build_demo(example / "bundle", state, books, out, DEMO_APPROVER)
    service, store, intake = demo.service, demo.store, demo.intake

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
    if approve and not keep:  # the verify line above names a file in the folder about to be removed
        kept = (f"Temporary state removed, with the patched manifest in {state / 'cluster'} that the line above "
                "says to `kubectl apply -f`: run `vllm-oncall demo --approve --state-dir DIR` to keep it")
    final = store.get(incident.name) or incident
    out.write(f"\nIncident {incident.name}: {final.state}. {kept}\n")
    if not approve and incident.state == IncidentState.PROPOSED:
        out.write("Run `vllm-oncall demo --approve` to see the apply path.\n")
    return 0


def _print_manifest_diff(bundle: Path, cluster_state: Path, out: TextIO) -> None:
    import yaml

    from bot.cli.manifest import server_fields_removed, unified_diff

    """The patched workload against the bundle's, as `kubectl diff` would show it: without the
    fields the API server sets (status, uid, resourceVersion, ...)."""
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


def run_test_incident(args: argparse.Namespace) -> int:
    from bot.cli.settings import SettingsError, load_settings

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings(config_file=args.config)
    except SettingsError as exc:
        print(f"vllm-oncall test-incident: {exc}", file=sys.stderr)
        return 2
    posted, line = _wiring().post_test_incident(settings, args.channel or settings.slack.channel)
    print(line if posted else f"vllm-oncall test-incident: {line}", file=sys.stdout if posted else sys.stderr)
    return 0 if posted else 1


# ---- serve --------------------------------------------------------------------------------


def _wiring():  # -> the bot.cli.wiring module
    """The composition root, with the clients it imports (slack_bolt, kubernetes, ...): loaded
    here, in this one place, only when a command serves, so `vllm-oncall --help` stays cheap."""
    from bot.cli import wiring

    return wiring


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
    wiring = _wiring()
    try:
        if args.check:  # everything first, so "OK" is never printed for a bot that cannot work
            checked = wiring.check_dependencies(settings, offline=args.offline)
            print(f"configuration OK: {_summary(settings)}\n{checked}")
            return 0
        app = wiring.build(settings)
    except (ClusterAccessError, PlaybookError, wiring.CheckFailed) as exc:
        print(f"vllm-oncall serve: {exc}", file=sys.stderr)
        return 2
    logging.getLogger(__name__).info("starting vllm-oncall %s: %s", version(), _summary(settings))
    settle_for_serving()
    # Kubernetes stops pods with SIGTERM: finish cleanly (the incidents are in the store anyway).
    signal.signal(signal.SIGTERM, lambda *_: app.server.request_stop())
    if app.socket_handler is not None:
        app.socket_handler.connect()  # returns at once; events arrive on its own threads
    app.server.serve_forever()
    if app.socket_handler is not None:
        app.socket_handler.close()
    return 0


# How long a thread may keep the GIL while another waits for it (CPython's default: 5 ms). The alert
# workers (16 by default) give it up at every Kubernetes and Slack call anyway; the forced hand-overs
# fall inside their CPU-bound stretches (the diagnosis, the incident's record), each a switch among
# many waiting threads, and on a busy machine a hand-over to a thread the OS has not run yet stalls
# them all. Against 5 ms, in interleaved runs of benchmarks/bench_scale.py (see its docstring).
GIL_SWITCH_SECONDS = 0.01


def settle_for_serving() -> None:
    """Once `serve` is wired, before it takes work: everything built so far (modules, the Kubernetes
    client's classes, playbooks, compiled patterns) lives as long as the process, so it is moved
    out of the collector's reach and a full collection walks only what the work allocates (each one
    had walked the whole start-up heap: 0.1-0.3 s, 2-4 ms per alert at 40 alerts/s; see docs/speed.md,
    "Speed at scale"); and threads keep the GIL for GIL_SWITCH_SECONDS."""
    gc.collect()
    gc.freeze()
    sys.setswitchinterval(GIL_SWITCH_SECONDS)


def _overrides(args: argparse.Namespace) -> dict:
    """Command-line options that are settings too (they win over the environment)."""
    out: dict = {"playbooks": args.playbooks} if args.playbooks else {}
    if getattr(args, "watch", False):
        out["watch"] = True
    return out


def _summary(settings: Settings) -> str:
    mode = "Socket Mode" if settings.slack.app_token else f"HTTP (POST /slack/events on {settings.http.listen})"
    store_desc = (f"vllmincidents in namespace {settings.incident_namespace_or_default()}"
                  if settings.store == "kube" else f"folder {settings.state_dir / 'incidents'}")
    approvers = ", ".join(settings.approver_users + settings.approver_groups) or "none"
    return (f"{_clusters_summary(settings)}; mode {settings.mode}; Slack via {mode}, channel "
            f"{settings.slack.channel}; incidents: {store_desc}; approvers: {approvers}; "
            f"alerts: {', '.join(settings.http.alertnames)} on {settings.http.listen}/alerts"
            f"{' (bearer token required)' if settings.http.alert_token else ' (NO bearer token: unauthenticated)'}"
            f"{_wiring().watch_summary(settings)}")


def _clusters_summary(settings: Settings) -> str:
    if not settings.clusters:
        return f"cluster {settings.cluster_name}"
    served = ", ".join(f"{name} (context {context})" for name, context in settings.contexts.items())
    return (f"clusters {served}; default {settings.cluster_name}; alerts routed by their "
            f"{settings.cluster_label!r} label")
