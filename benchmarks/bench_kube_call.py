"""CPU of one Kubernetes API call in the calling thread, for the calls an alert makes: a read
(KubeApi.get_pod) and the three that carry a body, replayed exactly as the bot sent them.

The bodies are the bot's own: one new alert goes through the bot wired as `serve` wires it
(bot.cli.wiring.build, as benchmarks/bench_cpu_alert.py), against the local API and Slack
stand-ins (tests/kubeapi, tests/slackapi), and the requests the API stand-in recorded give the
VLLMIncident the bot created (18.5 KB of JSON, most of it the redacted record), the merge patch
it updated it with, and the server-side dry run of its JSON Patch of the Deployment (4 `test` ops
and the `replace`). Each is then sent
again through a KubeApi made from a kubeconfig with a bearer token, by the kubeconfig loader (its
refresh hook runs at every call): the create under a new name each time, the update with the
current resourceVersion (its precondition), the dry run as it was. The stand-in answers in its own
threads, so time.thread_time counts only the bot's side: building the request, the HTTP layer,
reading and parsing the answer.

Run: python benchmarks/bench_kube_call.py [--calls 2000] [--runs 5] [--tree /work/main]
(--tree: measure another checkout's bot/ with this same benchmark, e.g. main, for an A/B.)

Measured 2026-12-03 16:43-16:46 UTC, the kubelean branch (KubeApi's requests on the client's pool
through bot/kube/wire.py) against main d66dc9a, 5 interleaved pairs (A B A B ...; each `--runs 1`,
2000 calls a kind; main measured with `--tree /work/main` and main's venv), load average 3.9-5.9:
median of the 5 runs, in us of CPU per call (the runs' range in brackets)

| call                        | main            | kubelean        | change |
|-----------------------------|-----------------|-----------------|--------|
| get_pod                     | 335 (287-392)   | 138 (96-147)    | -59%   |
| create incident (18.5 KB)   | 510 (452-658)   | 231 (197-293)   | -55%   |
| update incident (18.4 KB)   | 512 (487-673)   | 270 (198-293)   | -47%   |
| dry-run JSON Patch (0.5 KB) | 496 (466-688)   | 210 (147-264)   | -58%   |

Again at 17:04 with the final code (3 pairs, load 6.1-7.9), main -> kubelean: get_pod 262 -> 93 us
(-64%), create incident 436 -> 202 us (-54%), update incident 468 -> 189 us (-60%), dry-run JSON
Patch 469 -> 147 us (-69%). On a quieter machine (load 1-2), one run each: get_pod 276 -> 156 us
(this benchmark's kubeconfig set-up), 264 -> 125 us (the earlier set-up: a configuration with a
no-op refresh hook).

What it makes of an alert (main -> kubelean, interleaved, load 5-12, so read the CPU, not the
rates): bench_cpu_alert, 9 pairs of `--runs 1`, the worker thread per new alert 16.0 -> 11.5 ms
(medians; ranges 12.8-19.5 and 9.3-13.3), per repeat 2.9 -> 2.6 ms; bench_scale, 3 pairs of
`--runs 1 --burst 0`, the process's CPU per new alert one at a time 21.0 -> 13.2 ms, per repeat
3.6 -> 3.0 ms, 50 senders 45.9 -> 48.2 alerts/s (runs 38.6-52.4 and 43.0-63.5: the load decided
the rates). Still 8 Kubernetes calls per new alert and 2 per repeat: each is a check or a write
(the pod, its previous log, the node; the ReplicaSet and the Deployment, the owner checks against
a forged ownerReference; the server-side dry run; the incident's create and its compare-and-swap
update), none answered by the one before.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

KUBECONFIG = str(Path(tempfile.mkdtemp()) / "kubeconfig")
os.environ["KUBECONFIG"] = KUBECONFIG  # the kubernetes package reads it once, at import
HERE = Path(__file__).resolve().parents[1]
GROUP, VERSION, PLURAL, INCIDENTS = "oncall.vllm.ai", "v1", "vllmincidents", "vllm-oncall"
CALLS = ("get_pod", "create incident", "update incident", "dry-run JSON Patch")


def bot_requests(kube: Any, slack: Any) -> tuple[str, dict[str, Any], dict[str, Any], list[dict[str, Any]], str]:
    """One new alert through the bot as `serve` wires it; (its pod, the incident it created, the
    merge patch it updated the incident with, the JSON Patch it dry-ran on the Deployment, the
    Deployment's name)."""
    import bench_scale as scale
    from builders import kubeconfig_for

    from bot.app.records import AlertTarget
    from bot.cli.settings import load_settings
    from bot.cli.wiring import build

    env = {"KUBECONFIG": kubeconfig_for(kube.url, Path(KUBECONFIG)), "VLLM_ONCALL_CLUSTER": "bench",
           "SLACK_BOT_TOKEN": "xoxb-bench", "SLACK_SIGNING_SECRET": "s3", "SLACK_API_URL": slack.url,
           "VLLM_ONCALL_SLACK_CHANNEL": "C0BENCH", "VLLM_ONCALL_APPROVERS": "U0A", "VLLM_ONCALL_STORE": "kube",
           "VLLM_ONCALL_INCIDENT_NAMESPACE": INCIDENTS, "VLLM_ONCALL_CLUSTER_SOURCE": "kube",
           "VLLM_ONCALL_DEFAULT_NAMESPACE": scale.NS, "VLLM_ONCALL_ALERT_TOKEN": scale.TOKEN,
           "VLLM_ONCALL_SLACK_POST_INTERVAL": "0", "VLLM_ONCALL_SLACK_UPDATE_INTERVAL": "0",
           "VLLM_ONCALL_LISTEN": "127.0.0.1:0"}
    service = build(load_settings(env)).clusters[0].service
    pod = scale.crashing(kube, "vllm-bench-000")
    kube.requests.clear()
    service.handle_alert(AlertTarget(namespace=scale.NS, pod=pod, container="vllm"))
    custom = f"/apis/{GROUP}/{VERSION}/namespaces/{INCIDENTS}/{PLURAL}"

    def body(method: str, where: Callable[[str], bool]) -> tuple[Any, str]:
        found = [r for r in kube.requests if r.method == method and where(r.target)]
        if not found:
            raise SystemExit(f"the alert sent no {method} matching what this benchmark replays: "
                             f"{[(r.method, r.target) for r in kube.requests]}")
        return json.loads(found[0].body), found[0].target

    created, _ = body("POST", lambda target: target == custom)
    update, _ = body("PATCH", lambda target: target.startswith(custom + "/"))
    ops, target = body("PATCH", lambda target: "/deployments/" in target and "dryRun=All" in target)
    return pod, created, update, ops, target.split("/deployments/")[1].split("?")[0]


def one_run(calls: int) -> dict[str, float]:
    """Median microseconds of CPU per call of each kind, over `calls` calls after a warm-up."""
    import bench_scale as scale

    from bot.kube.api import KubeApi, api_client_from_environment
    from bot.kube.retry import RetryPolicy

    kube, slack = scale.FakeKube().start(), scale.SlackStandIn().start()
    try:
        pod, created, update, ops, deployment = bot_requests(kube, slack)
        api = KubeApi(api_client_from_environment(kubeconfig=KUBECONFIG), retry=RetryPolicy(attempts=1))
        name = created["metadata"]["name"]
        sizes = {"incident": len(json.dumps(created)), "update": len(json.dumps(update)), "ops": len(json.dumps(ops))}
        count = iter(range(10 ** 9))
        version = [str(api.get_custom(GROUP, VERSION, INCIDENTS, PLURAL, name)["metadata"]["resourceVersion"])]

        def create() -> None:
            created["metadata"]["name"] = f"{name}-{next(count)}"  # a new object each time
            api.create_custom(GROUP, VERSION, INCIDENTS, PLURAL, created)

        def patch() -> None:
            update["metadata"]["resourceVersion"] = version[0]  # the compare-and-swap precondition
            version[0] = api.patch_custom(GROUP, VERSION, INCIDENTS, PLURAL, name, update)["metadata"]["resourceVersion"]

        kinds: dict[str, Callable[[], Any]] = {
            "get_pod": lambda: api.get_pod(scale.NS, pod),
            "create incident": create,
            "update incident": patch,
            "dry-run JSON Patch": lambda: api.patch_workload("Deployment", scale.NS, deployment, ops, dry_run=True)}
        medians = {}
        for kind, call in kinds.items():
            for _ in range(50):
                call()
            costs = []
            for _ in range(calls):
                start = time.thread_time()
                call()
                costs.append(time.thread_time() - start)
            medians[kind] = statistics.median(costs) * 1e6
        print(f"bodies as the bot sent them, bytes of JSON: {sizes}", file=sys.stderr)
        return medians
    finally:
        slack.stop()
        kube.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tree", type=Path, default=HERE, help="the checkout whose bot/ is measured")
    args = parser.parse_args()
    sys.path[:0] = [str(args.tree), str(args.tree / "tests"), str(args.tree / "benchmarks")]
    logging.basicConfig(level=logging.ERROR)
    runs = []
    for run in range(args.runs):
        runs.append(one_run(args.calls))
        print(f"run {run + 1}: " + ", ".join(f"{kind} {runs[-1][kind]:.0f} us" for kind in CALLS), file=sys.stderr)
    print(f"CPU per call, calling thread ({args.tree}, {args.runs} runs of {args.calls}, median; load average "
          f"{os.getloadavg()[0]:.1f}): " + ", ".join(f"{kind} {statistics.median(r[kind] for r in runs):.0f} us"
                                                     for kind in CALLS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
