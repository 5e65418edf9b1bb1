"""Terminal commands that talk to a cluster: why, collect, apply, rollback, fix.

Same safety rules as the Slack button: `apply` shows the change and the server-side dry run,
asks before patching (unless --yes), and patches only if the workload is still as diagnosed.
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import sys
from pathlib import Path

from bot.cli import books as cli_books
from bot.diagnosis.render import command_line

REQUEST_TIMEOUT_SECONDS = 3.0  # a silent API server: the command fails in ~10 s, not 5 tries x 30 s
CONNECT_TIMEOUT_SECONDS = 3.0
RETRY_LOGGER = "bot.retry"  # bot.support.retrying


def _friendly(func):
    """Turn the errors a person can act on (pod gone, permission missing, API error) into one line."""

    def run(args: argparse.Namespace) -> int:
        from kubernetes.config import ConfigException

        from bot.app.ports import PodNotFound
        from bot.cli.access import ClusterAccessError
        from bot.kube.errors import KubeError  # every API failure, e.g. "Kubernetes API error 500: ..."

        try:
            return func(args)
        except (PodNotFound, KubeError, ConfigException, ClusterAccessError) as exc:
            print(f"vllm-oncall: {exc}", file=sys.stderr)
            return 2

    run.__name__ = func.__name__
    return run


def _cluster(args: argparse.Namespace):
    from bot.cli.access import api_client, check_reachable
    from bot.kube.api import KubeApi
    from bot.kube.live import LiveCluster
    from bot.kube.retry import RetryPolicy

    client = api_client(args.context, args.kubeconfig)
    timeout = args.request_timeout
    check_reachable(client, timeout=min(timeout, CONNECT_TIMEOUT_SECONDS))
    # A command ends in about 3 x --request-timeout however the server behaves (silent, slow):
    # no new try starts after 2 x, and each try ends within 1 x.
    retry = RetryPolicy(attempts=3, maximum=timeout / 2, budget=2 * timeout)
    # A terminal command ends with one line saying what failed; the retries before it stay quiet
    # (serve logs them: there nobody is watching the terminal).
    logging.getLogger(RETRY_LOGGER).setLevel(logging.ERROR)
    return LiveCluster(KubeApi(client, retry=retry, request_timeout=timeout), name=args.cluster or args.context or "default",
                       playbooks=cli_books.books_for(args))


def _diagnose(evidence, args: argparse.Namespace):
    from bot.diagnosis.diagnose import diagnose

    return diagnose(evidence, cli_books.books_for(args))


def _print_report(diagnosis, fmt: str) -> None:
    from bot.diagnosis.render import render_text

    print(json.dumps(diagnosis.to_public_json(), indent=2) if fmt == "json" else render_text(diagnosis))


def _actor(args: argparse.Namespace) -> str:
    return args.actor or f"terminal:{getpass.getuser()}"


def _split_target(pod: str, namespace: str) -> tuple[str, str]:
    """`ns/pod` or `pod` with -n."""
    if "/" in pod:
        ns, _, name = pod.partition("/")
        return ns, name
    return namespace, pod


def _collect(args: argparse.Namespace, gpu_pods: bool = False):
    """The cluster, and the evidence of the pod (or newest crashing pod of the workload) named."""
    cluster = _cluster(args)
    namespace, name = _split_target(args.pod, args.namespace)
    pod = cluster.resolve_pod(namespace, name)
    return cluster, cluster.collect(namespace, pod, args.container, gpu_pods=gpu_pods)


@_friendly
def cmd_why(args: argparse.Namespace) -> int:
    cluster, evidence = _collect(args)
    diagnosis = _diagnose(evidence, args)
    _print_report(diagnosis, args.format)
    if args.format == "text":
        workload = cluster.workload_for(evidence)
        print(f"\nWorkload: {workload.kind} {workload.namespace}/{workload.name} (container {workload.container})")
        if workload.live_patch_blocked:
            print(f"No live patch: {workload.live_patch_blocked}")
            proposal = cluster.propose(diagnosis, evidence, workload)  # blocked: no API write, not even a dry run
            if proposal is not None:
                print(proposal.workload.repository_hint or "")
                print(proposal.manifest_diff or "")
        elif diagnosis.changes:
            print(f"To apply: vllm-oncall apply {diagnosis.namespace}/{diagnosis.pod}")
    return 0


@_friendly
def cmd_collect(args: argparse.Namespace) -> int:
    from bot.kube.collect import write_bundle
    from bot.remedy.ownership import resolve_owner

    cluster, evidence = _collect(args, gpu_pods=True)  # a ticket bundle lists the node's other GPU pods
    _, workload = resolve_owner(cluster.api, evidence.pod or {}, evidence.container or "")
    for path in write_bundle(evidence, Path(args.output), workload):
        print(path)
    return 0


@_friendly
def cmd_apply(args: argparse.Namespace) -> int:
    cluster, evidence = _collect(args)
    diagnosis = _diagnose(evidence, args)
    proposal = cluster.propose(diagnosis, evidence, cluster.workload_for(evidence))
    if proposal is None:
        print(f"Nothing to apply: {diagnosis.cause or 'no known cause'} - {diagnosis.title}")
        return 1
    ref = proposal.workload
    print(f"{ref.kind} {ref.namespace}/{ref.name}, container {ref.container}: {proposal.title}")
    print("  before: " + command_line(proposal.command_before))
    print("  after:  " + command_line(proposal.command_after))
    if ref.live_patch_blocked:
        print(f"\nNo live patch: {ref.live_patch_blocked}")
        if proposal.workload.repository_hint:
            print(proposal.workload.repository_hint)
        if proposal.manifest_diff:
            print(proposal.manifest_diff)
        return 1
    print(f"  dry run: {proposal.dry_run_message}")
    if not proposal.dry_run_ok:
        return 1
    if not args.yes:
        if not sys.stdin.isatty():  # a script or a pipe: nobody to answer, so never guess
            print(f"vllm-oncall: not applied: stdin is not a terminal, so nobody can confirm; "
                  f"pass --yes to patch {ref.kind} {ref.namespace}/{ref.name} without asking", file=sys.stderr)
            return 2
        try:
            answer = input(f"Patch {ref.kind} {ref.namespace}/{ref.name}? [y/N] ").strip().lower()
        except EOFError:
            answer = ""
        if answer not in ("y", "yes"):
            print("Not applied.")
            return 1
    result = cluster.apply(proposal, _actor(args))
    print(result.message)
    if not result.ok:
        return 3 if result.conflict else 1
    if args.verify and result.workload:
        verification = cluster.verify(result.workload, args.timeout, lambda evidence: _diagnose(evidence, args))
        print(verification.message)
        return 0 if verification.ready else 1
    return 0


@_friendly
def cmd_rollback(args: argparse.Namespace) -> int:
    kind, _, name = args.workload.partition("/")
    kinds = {"deployment": "Deployment", "deploy": "Deployment", "deployments": "Deployment",
             "statefulset": "StatefulSet", "sts": "StatefulSet", "statefulsets": "StatefulSet"}
    if not name or kind.lower() not in kinds:
        print("vllm-oncall: rollback takes KIND/NAME, e.g. deployment/llama", file=sys.stderr)
        return 2
    result = _cluster(args).rollback(args.namespace, kinds[kind.lower()], name, _actor(args))
    print(result.message)
    return 0 if result.ok else (3 if result.conflict else 1)


def cmd_fix(args: argparse.Namespace) -> int:
    from bot.cli.manifest import ManifestError, differences, workload_document
    from bot.diagnosis.evidence import load_bundle
    from bot.remedy.changes import ChangeError, rewrite_manifest

    manifest = Path(args.manifest)
    text = manifest.read_text(encoding="utf-8")  # a missing file: one line from main()
    evidence = load_bundle(args.bundle)
    diagnosis = _diagnose(evidence, args)
    if diagnosis.cause is None or not diagnosis.changes:
        print(f"Nothing to change: {diagnosis.cause or 'no known cause'} - {diagnosis.title}")
        return 1
    container = args.container or evidence.container
    try:
        workload = workload_document(manifest, text)
        drift = differences(workload, container, diagnosis.changes)
        new_text, touched = rewrite_manifest(text, diagnosis.changes, container)
    except (ManifestError, ChangeError) as exc:
        print(f"vllm-oncall: {exc}" if isinstance(exc, ManifestError) else f"vllm-oncall: {manifest}: {exc}",
              file=sys.stderr)
        return 2
    for line in drift:  # the file is not what the crashed pod ran: say so before changing it
        print(f"vllm-oncall: warning: {manifest}: {line}", file=sys.stderr)
    if not touched:
        print(f"{manifest}: already as proposed ({diagnosis.cause})")
        return 0
    if args.dry_run:
        sys.stdout.write(new_text)
        return 0
    manifest.write_text(new_text, encoding="utf-8")
    print(f"{manifest}: {diagnosis.cause}: changed {', '.join(touched)}")
    for change in diagnosis.changes:
        print(f"  {change.kind} {change.name}: {change.before if change.before is not None else '(not set)'}"
              f" -> {change.after if change.after is not None else '(removed)'}")
    return 0


def _cluster_options(p: argparse.ArgumentParser, namespace: bool = True) -> None:
    if namespace:
        p.add_argument("-n", "--namespace", default="default")
    p.add_argument("--context", help="kubeconfig context (default: in-cluster, else the current context)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG or ~/.kube/config)")
    p.add_argument("--cluster", help="the cluster's name in messages (default: the context)")
    p.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT_SECONDS, metavar="SECONDS",
                   help=f"seconds one API request may take (default {REQUEST_TIMEOUT_SECONDS:g}; the command "
                        "gives up after about three times that)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add the cluster subcommands to the `vllm-oncall` parser."""
    p = sub.add_parser("why", help="diagnose a crash-looping pod in the cluster (same report as diagnose)")
    p.add_argument("pod", help="pod, ns/pod, or a Deployment/StatefulSet name (its newest crashing pod)")
    p.add_argument("-c", "--container")
    p.add_argument("--format", choices=["text", "json"], default="text")
    _cluster_options(p)
    cli_books.add_option(p)
    p.set_defaults(func=cmd_why)

    p = sub.add_parser("collect", help="write a pod's evidence bundle (logs, pod, node, events, workload)")
    p.add_argument("pod")
    p.add_argument("-o", "--output", required=True, help="bundle folder to write")
    p.add_argument("-c", "--container")
    _cluster_options(p)
    p.set_defaults(func=cmd_collect)

    p = sub.add_parser("apply", help="diagnose a pod and apply the proposed change to its workload")
    p.add_argument("pod")
    p.add_argument("-c", "--container")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--as", dest="actor", help="who approves (recorded in the audit annotation)")
    p.add_argument("--verify", action="store_true", help="follow the rollout after patching")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for the new pod (default 1800)")
    _cluster_options(p)
    cli_books.add_option(p)
    p.set_defaults(func=cmd_apply)

    p = sub.add_parser("rollback", help="restore what the last vllm-oncall change replaced")
    p.add_argument("workload", help="KIND/NAME, e.g. deployment/llama")
    p.add_argument("--as", dest="actor", help="who rolls back (recorded in the audit annotation)")
    _cluster_options(p)
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser("fix", help="rewrite a Deployment/StatefulSet manifest file with the proposed change")
    p.add_argument("bundle", help="evidence bundle folder")
    p.add_argument("--manifest", required=True, help="YAML file to rewrite in place (comments and layout kept)")
    p.add_argument("-c", "--container")
    p.add_argument("--dry-run", action="store_true", help="print the new manifest instead of writing it")
    cli_books.add_option(p)
    p.set_defaults(func=cmd_fix)
