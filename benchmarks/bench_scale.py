"""How the bot scales: new incidents from 1, 10 and 50 concurrent senders, repeats, a 5 MB log, and a
250-workload crash burst through the pod watch, each beside the floor on the same stand-ins.

The bot runs as `vllm-oncall serve`, a separate process (its own interpreter and GIL), configured
as in production (the live Kubernetes client, incidents as VLLMIncident objects, the Slack
WebClient, the one work queue with VLLM_ONCALL_WORKERS workers). The far ends are the project's
stand-ins (tests/kubeapi: the Kubernetes API, tests/slackapi: Slack's Web API), in this process,
with the senders.

- new incidents: each sender sends one Alertmanager webhook for a Deployment not seen before and
  waits for its message; latency is from sending to the stand-in receiving chat.postMessage.
  alerts/s is alerts over the time from the first send to the last message. CPU per alert is
  the bot process's user+system CPU over the level, divided by its alerts; RSS is the bot's at
  the end of the level.
- repeats: the same alerts again (the same crash, unchanged): CPU per repeat.
- 5 MB log: new incidents whose previous log is 5 MB, one at a time: CPU per alert.
- burst: 250 Deployments (10,000 pods in the namespace) crash at once; the bot finds them with its
  pod watch (VLLM_ONCALL_WATCH). First and last time a workload is named at the top level (its
  message, or a line of a grouped message) after the crashes, times named per workload, CPU per
  workload. The Slack stand-in applies Slack's rate (one post a second per channel, about 50
  updates a minute, 429 past it) on the real clock, so a storm's backlog is grouped.
- the floor: a plain HTTP client (http.client, one kept-alive connection per sender) making the
  same requests a new alert costs the bot, counted on the stand-ins during the 1-sender level
  (the GETs as the bot sent them; the writes with bodies of the same size), at the same
  concurrency. What no bot on these stand-ins can beat.

Run: python benchmarks/bench_scale.py [--runs 3] [--levels 1,10,50] [--burst 250] [--burst-pods 10000]
The machine is shared: the load average is printed, and the ratios to the floor are the figures
to compare across machines.
"""

from __future__ import annotations

import argparse
import copy
import http.client
import json
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the stand-ins live in tests/

from builders import kubeconfig_for  # noqa: E402
from kubeapi import server as kubeapi_server  # noqa: E402
from kubeapi.objects import container, crashing_deployment, deployment, node, start_pod  # noqa: E402
from kubeapi.server import FakeKube  # noqa: E402
from slackapi import RateLimit, SlackStandIn  # noqa: E402

LOG = (ROOT / "examples" / "incident" / "bundle" / "previous.log").read_text()
NS, BURST_NS, TOKEN = "inference", "burst", "bench-token"
kubeapi_server._Handler.disable_nagle_algorithm = True  # as bench_alerts.py: measure the bot, not Nagle
VLLM_ARGS = ["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"]


def big_log(size: int) -> str:
    head, _, tail = LOG.partition("\n")
    line = "INFO 11-30 05:00:00 [logger.py:39] Received request cmpl-{:08d}: prompt: 'Summarise the quarterly report'\n"
    filler = "".join(line.format(i) for i in range(size // len(line)))
    return head + "\n" + filler + tail


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BotProcess:
    """`vllm-oncall serve` as its own process; CPU and RSS read from /proc."""

    def __init__(self, kube: FakeKube, slack: SlackStandIn, folder: Path, workers: int, watch: str | None = None):
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_SERVICE", "VLLM_ONCALL_"))}
        env.update({"KUBECONFIG": kubeconfig_for(kube.url, folder / "kubeconfig"), "PYTHONPATH": str(ROOT),
                    "VLLM_ONCALL_CLUSTER": "bench", "SLACK_BOT_TOKEN": "xoxb-bench", "SLACK_SIGNING_SECRET": "s3",
                    "SLACK_API_URL": slack.url, "VLLM_ONCALL_SLACK_CHANNEL": "C0BENCH",
                    "VLLM_ONCALL_APPROVERS": "U0A", "VLLM_ONCALL_STORE": "kube",
                    "VLLM_ONCALL_INCIDENT_NAMESPACE": "vllm-oncall", "VLLM_ONCALL_CLUSTER_SOURCE": "kube",
                    "VLLM_ONCALL_DEFAULT_NAMESPACE": NS, "VLLM_ONCALL_ALERT_TOKEN": TOKEN,
                    "VLLM_ONCALL_WORKERS": str(workers), "VLLM_ONCALL_QUEUE_SIZE": "1000",
                    "VLLM_ONCALL_LISTEN": f"127.0.0.1:{self.port}"})
        if watch:
            env.update({"VLLM_ONCALL_WATCH": "true", "VLLM_ONCALL_WATCH_NAMESPACES": watch})
        self.log = open(folder / "serve.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "bot.cli", "serve"], env=env, cwd=folder,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        self.spy = None
        if os.environ.get("BENCH_PROFILE"):  # a sampling profile of the bot: py-spy (pip install py-spy)
            self.spy = subprocess.Popen(["py-spy", "record", "-p", str(self.proc.pid), "-r", "100", "-f", "raw",
                                         "--nonblocking", "-o", os.environ["BENCH_PROFILE"]],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"serve exited ({self.proc.returncode}); see {folder / 'serve.log'}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2):
                    return
            except OSError:
                time.sleep(0.1)
        raise SystemExit("serve did not answer /healthz within 120 s")

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name) and not line.startswith("#"))

    def stop(self) -> None:
        if self.spy is not None:
            self.spy.send_signal(signal.SIGINT)
            self.spy.wait(60)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Posts:
    """The first message per workload, as the Slack stand-in receives them (one watcher thread)."""

    def __init__(self, slack: SlackStandIn):
        self.slack = slack
        self.first: dict[str, float] = {}
        self.count: Counter[str] = Counter()
        self._seen = 0
        self._lock = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            self.slack.wait_for(lambda: self._stop or len(self.slack.calls) > self._seen, 1)
            calls = self.slack.calls[self._seen:]
            self._seen += len(calls)
            with self._lock:
                for call in calls:
                    if call.method != "chat.postMessage" or call.params.get("thread_ts") or not call.ok:
                        continue
                    text = str(call.params.get("text") or "")
                    workload = text.split(": ", 1)[0].rsplit("/", 1)[-1]
                    self.count[workload] += 1
                    self.first.setdefault(workload, call.at)
                self._lock.notify_all()

    def wait(self, workload: str, timeout: float = 120) -> float | None:
        with self._lock:
            if self._lock.wait_for(lambda: workload in self.first, timeout):
                return self.first[workload]
        return None

    def wait_all(self, workloads: list[str], timeout: float = 300) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: all(w in self.first for w in workloads), timeout)

    def stop(self) -> None:
        self._stop = True


def alert_body(pod: str, namespace: str = NS) -> bytes:
    return json.dumps({"version": "4", "status": "firing", "receiver": "vllm-oncall", "alerts": [
        {"status": "firing", "labels": {"alertname": "KubePodCrashLooping", "namespace": namespace,
                                        "pod": pod, "container": "vllm"}, "annotations": {}}]}).encode()


def send(bot: BotProcess, pod: str) -> None:
    req = urllib.request.Request(bot.url + "/alerts", data=alert_body(pod), headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        if resp.status != 200:
            raise SystemExit(f"/alerts answered {resp.status}")


def crashing(kube: FakeKube, name: str, log: str = LOG, namespace: str = NS) -> str:
    _, pod = crashing_deployment(kube, name=name, namespace=namespace, previous_log=log, events=False, exit_code=1,
                                 containers=[container(command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
                                                       args=VLLM_ARGS)])
    return str(pod["metadata"]["name"])


# ---- new incidents, repeats ------------------------------------------------------------------

def level(bot: BotProcess, posts: Posts, pods: dict[str, str], senders: int) -> dict[str, float]:
    """Every workload of `pods` alerted once, by `senders` concurrent senders."""
    latencies: list[float] = []
    cpu0, start = bot.cpu(), time.monotonic()

    def one(item: tuple[str, str]) -> None:
        workload, pod = item
        sent = time.monotonic()
        send(bot, pod)
        at = posts.wait(workload)
        if at is None:
            raise SystemExit(f"no message for {workload}")
        latencies.append(at - sent)

    with ThreadPoolExecutor(max_workers=senders) as pool:
        list(pool.map(one, pods.items()))
    last = max(posts.first[w] for w in pods)
    cpu = bot.cpu() - cpu0
    return {"p50": statistics.median(latencies), "p99": percentile(latencies, 0.99),
            "rate": len(pods) / (last - start), "cpu": cpu / len(pods), "rss": bot.rss_mib()}


def repeats(bot: BotProcess, pods: dict[str, str], senders: int = 10) -> float:
    """CPU per repeat of an alert whose crash is unchanged."""
    before = bot.metric("vllm_oncall_alert_repeats_total")
    cpu0 = bot.cpu()
    with ThreadPoolExecutor(max_workers=senders) as pool:
        list(pool.map(lambda pod: send(bot, pod), pods.values()))
    deadline = time.monotonic() + 300
    while bot.metric("vllm_oncall_alert_repeats_total") < before + len(pods):
        if time.monotonic() > deadline:
            raise SystemExit("the repeats were not all counted within 300 s")
        time.sleep(0.05)
    return (bot.cpu() - cpu0) / len(pods)


# ---- the floor -------------------------------------------------------------------------------

class Replay:
    """The requests one new alert cost the bot, replayed by a plain client (see the docstring)."""

    def __init__(self, kube: FakeKube, slack: SlackStandIn, kube_calls: list[Any], slack_calls: list[Any]):
        self.kube, self.slack = kube, slack
        self.gets = [c for c in kube_calls if c.verb == "get"]
        self.writes = [c for c in kube_calls if c.verb != "get"]
        self.posts = [c for c in slack_calls if c.method == "chat.postMessage"]
        self.record = json.dumps({"x": "y" * 60_000})  # about the size of an incident record with its evidence

    def _path(self, call: Any) -> str:
        ns = f"/namespaces/{call.namespace}" if call.namespace else ""
        resource, _, sub = call.resource.partition("/")
        base = {"": "/api/v1", "apps": "/apis/apps/v1"}.get(call.group, f"/apis/{call.group}/v1")
        query = "&".join(f"{k}={v}" for k, v in call.query.items())
        return f"{base}{ns}/{resource}/{call.name}{'/' + sub if sub else ''}{'?' + query if query else ''}"

    def one(self, kube: http.client.HTTPConnection, slack: http.client.HTTPConnection, n: int) -> None:
        for call in self.gets:
            kube.request("GET", self._path(call))
            kube.getresponse().read()
        for call in self.writes:
            if call.verb == "create":
                body = json.dumps({"apiVersion": "oncall.vllm.ai/v1", "kind": "VLLMIncident",
                                   "metadata": {"name": f"floor-{threading.get_ident()}-{n}"},
                                   "spec": {"record": self.record}})
                path = f"/apis/{call.group}/v1/namespaces/{call.namespace}/{call.resource}"
                kube.request("POST", path, body, {"Content-Type": "application/json"})
            else:
                body = json.dumps([{"op": "test", "path": "/metadata/name", "value": call.name}])
                kube.request("PATCH", self._path(call), body, {"Content-Type": "application/json-patch+json"})
            kube.getresponse().read()
        for call in self.posts:
            slack.request("POST", "/api/chat.postMessage", json.dumps(call.params),
                          {"Content-Type": "application/json", "Authorization": "Bearer xoxb-bench"})
            slack.getresponse().read()

    def run(self, alerts: int, senders: int) -> dict[str, float]:
        latencies: list[float] = []
        start = time.monotonic()

        def sender(i: int) -> None:
            kube = http.client.HTTPConnection(urlsplit(self.kube.url).netloc, timeout=60)
            slack = http.client.HTTPConnection(urlsplit(self.slack.url).netloc, timeout=60)
            for n in range(i, alerts, senders):
                t = time.monotonic()
                self.one(kube, slack, n)
                latencies.append(time.monotonic() - t)
            kube.close()
            slack.close()

        with ThreadPoolExecutor(max_workers=senders) as pool:
            list(pool.map(sender, range(senders)))
        return {"p50": statistics.median(latencies), "p99": percentile(latencies, 0.99),
                "rate": alerts / (time.monotonic() - start)}


# ---- one run ---------------------------------------------------------------------------------

def alerts_run(levels: list[int], workers: int, folder: Path) -> dict[str, Any]:
    kube, slack = FakeKube().start(), SlackStandIn().start()
    kube.put(node())
    sizes = {c: max(40, 4 * c) for c in levels}
    pods = {c: {f"vllm-c{c:02d}-{i:03d}": "" for i in range(n)} for c, n in sizes.items()}
    for per in pods.values():
        for workload in per:
            per[workload] = crashing(kube, workload)
    big = {f"vllm-big-{i}": crashing(kube, f"vllm-big-{i}", big_log(5 * 1024 * 1024)) for i in range(3)}
    warm = crashing(kube, "vllm-warm-up")
    bot = BotProcess(kube, slack, folder, workers)
    posts = Posts(slack)
    out: dict[str, Any] = {"levels": {}, "floor": {}}
    try:
        # One alert first, not measured: serve builds its Kubernetes client (and imports its
        # models) at the first alert; a bot that has been up for a while has done that.
        send(bot, warm)
        if posts.wait("vllm-warm-up") is None:
            raise SystemExit("no message for the warm-up alert")
        for c in levels:
            k0, s0 = len(kube.calls), len(slack.calls)
            out["levels"][c] = level(bot, posts, pods[c], c)
            if c == levels[0]:  # the requests of one new alert, for the floor
                n = len(pods[c])
                kube_calls, slack_calls = kube.calls[k0:], slack.calls[s0:]
                one_kube = kube_calls[: len(kube_calls) // n] if n else []
                out["calls_per_alert"] = len(kube_calls) / n
                out["slack_calls_per_alert"] = len(slack_calls) / n
                replay = Replay(kube, slack, one_kube, [c for c in slack_calls if c.method == "chat.postMessage"]
                                [: len([c for c in slack_calls if c.method == "chat.postMessage"]) // n])
        out["repeat_cpu"] = repeats(bot, pods[levels[-1]])
        cpu = []
        for workload, pod in big.items():
            c0 = bot.cpu()
            send(bot, pod)
            if posts.wait(workload) is None:
                raise SystemExit(f"no message for {workload}")
            cpu.append(bot.cpu() - c0)
        out["big_cpu"] = statistics.median(cpu)
        for c in levels:
            out["floor"][c] = replay.run(sizes[c], c)
    finally:
        posts.stop()
        bot.stop()
        slack.stop()
        kube.stop()
    return out


class NamedPosts(Posts):
    """The first time each workload is named at the top level: its own message, or a line of a storm's
    grouped message (bot/app/grouping.py)."""

    def _run(self) -> None:
        while not self._stop:
            self.slack.wait_for(lambda: self._stop or len(self.slack.calls) > self._seen, 1)
            calls = self.slack.calls[self._seen:]
            self._seen += len(calls)
            with self._lock:
                for call in calls:
                    if call.method != "chat.postMessage" or call.params.get("thread_ts") or not call.ok:
                        continue
                    if (call.params.get("metadata") or {}).get("event_type") == "vllm_oncall_group":
                        self.groups += 1
                        named = [b["text"]["text"].split("`")[1].rsplit("/", 1)[-1] for b in call.params["blocks"]
                                 if str(b.get("block_id", "")).startswith("group-line-")]
                    else:
                        named = [str(call.params.get("text") or "").split(": ", 1)[0].rsplit("/", 1)[-1]]
                    for workload in named:
                        self.count[workload] += 1
                        self.first.setdefault(workload, call.at)
                self._lock.notify_all()

    groups = 0


def burst_run(workloads: int, total_pods: int, workers: int, folder: Path) -> dict[str, Any]:
    kube, slack = FakeKube().start(), SlackStandIn().start()
    # Slack's own rate, on the real clock: one post per second per channel, ~50 updates a minute
    # (429 with Retry-After past it); the bot paces itself and groups a storm's backlog.
    slack.rate = RateLimit(time.monotonic)
    kube.put(node())
    c = [container(command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"], args=VLLM_ARGS)]
    names, pods = [], []
    for i in range(workloads):
        dep = kube.put(deployment(f"vllm-burst-{i:03d}", c, BURST_NS))
        names.append(dep["metadata"]["name"])
        pods.append(start_pod(kube, dep, "ready")["metadata"]["name"])
    others = kube.put(deployment("web", [container(command=["nginx"])], BURST_NS))
    template = start_pod(kube, others, "ready", suffix="aaaaa")
    for i in range(max(0, total_pods - workloads - 1)):
        pod = copy.deepcopy(template)
        pod["metadata"]["name"] = f"web-{i:06d}"
        for key in ("uid", "resourceVersion"):
            pod["metadata"].pop(key, None)
        kube.put(pod)
    bot = BotProcess(kube, slack, folder, workers, watch=BURST_NS)
    posts = NamedPosts(slack)
    try:
        if not kube.wait_for_watchers(1, timeout=600):  # the initial list of 10,000 pods, on a busy machine
            raise SystemExit("the pod watch never started")
        cpu0 = bot.cpu()
        start = time.monotonic()
        for pod in pods:
            kube.set_log(BURST_NS, pod, "vllm", LOG, previous=True)

            def crashed(obj: dict[str, Any]) -> None:
                cs = obj["status"]["containerStatuses"][0]
                cs["restartCount"] = 1
                cs["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}}
                cs["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error",
                                                  "startedAt": "2026-11-30T05:00:00Z",
                                                  "finishedAt": "2026-11-30T05:01:30Z"}}

            kube.edit("Pod", pod, BURST_NS, crashed)
        if not posts.wait_all(names, 600):
            missing = [n for n in names if n not in posts.first]
            raise SystemExit(f"{len(missing)} workloads got no message within 600 s")
        times = sorted(posts.first[n] for n in names)
        cpu = bot.cpu() - cpu0
        time.sleep(2)  # a second message per workload would come now, if the bot sent one
        counts = [posts.count[n] for n in names]
        top = [c for c in slack.delivered("chat.postMessage") if not c.params.get("thread_ts")]
        return {"first": times[0] - start, "last": times[-1] - start, "cpu": cpu / workloads,
                "per_workload": (min(counts), max(counts)), "rss": bot.rss_mib(),
                "top_level": len(top), "groups": posts.groups, "limited": len(slack.rate.limited)}
    finally:
        posts.stop()
        bot.stop()
        slack.stop()
        kube.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh runs (new stand-ins, new bot process)")
    parser.add_argument("--levels", default="1,10,50", help="concurrent senders")
    parser.add_argument("--workers", type=int, default=16, help="VLLM_ONCALL_WORKERS (serve's default: 16)")
    parser.add_argument("--burst", type=int, default=250, help="workloads crashing at once (0: skip)")
    parser.add_argument("--burst-pods", type=int, default=10_000, help="pods in the burst's namespace")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    levels = [int(x) for x in args.levels.split(",")]
    load_before = os.getloadavg()
    runs, bursts = [], []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
            runs.append(alerts_run(levels, args.workers, Path(tmp)))
            line = "; ".join(f"{c} senders p50 {r['p50'] * 1000:.0f} ms p99 {r['p99'] * 1000:.0f} ms "
                             f"{r['rate']:.1f}/s cpu {r['cpu'] * 1000:.1f} ms" for c, r in runs[-1]["levels"].items())
            print(f"run {run + 1}: {line}; repeat cpu {runs[-1]['repeat_cpu'] * 1000:.1f} ms; "
                  f"5 MB cpu {runs[-1]['big_cpu'] * 1000:.0f} ms", file=sys.stderr, flush=True)
        if args.burst:
            with tempfile.TemporaryDirectory(prefix="bench-burst-") as tmp:
                bursts.append(burst_run(args.burst, args.burst_pods, args.workers, Path(tmp)))
                b = bursts[-1]
                print(f"run {run + 1}: burst first {b['first']:.2f} s last {b['last']:.2f} s, "
                      f"{b['cpu'] * 1000:.0f} ms cpu/workload, named/workload {b['per_workload']}, "
                      f"{b['top_level']} top-level messages ({b['groups']} grouped), "
                      f"{b['limited']} rate-limit answers", file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    report(runs, bursts, levels, args, load_before, load_after)
    return 0


def med(values: list[float]) -> float:
    return statistics.median(values)


def report(runs: list[dict[str, Any]], bursts: list[dict[str, Any]], levels: list[int], args: argparse.Namespace,
           load_before: tuple[float, ...], load_after: tuple[float, ...]) -> None:
    print(f"\nvllm-oncall scale benchmark: median of {len(runs)} fresh runs; serve as its own process "
          f"({args.workers} workers), stand-ins local; {os.cpu_count()} CPUs; load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"API calls per new alert: Kubernetes {med([r['calls_per_alert'] for r in runs]):.1f}, "
          f"Slack {med([r['slack_calls_per_alert'] for r in runs]):.1f}")
    print(f"\n{'new incidents':<22} {'p50':>9} {'p99':>9} {'alerts/s':>9} {'CPU/alert':>10} {'RSS':>8}"
          f" | {'floor p50':>9} {'floor p99':>9} {'floor/s':>8} | {'p50 x':>6} {'rate x':>6}")
    for c in levels:
        r = {k: med([run["levels"][c][k] for run in runs]) for k in ("p50", "p99", "rate", "cpu", "rss")}
        f = {k: med([run["floor"][c][k] for run in runs]) for k in ("p50", "p99", "rate")}
        print(f"{str(c) + ' senders':<22} {r['p50'] * 1000:>6.0f} ms {r['p99'] * 1000:>6.0f} ms {r['rate']:>9.1f} "
              f"{r['cpu'] * 1000:>7.1f} ms {r['rss']:>4.0f} MiB | {f['p50'] * 1000:>6.1f} ms {f['p99'] * 1000:>6.1f} ms "
              f"{f['rate']:>8.0f} | {r['p50'] / f['p50']:>6.1f} {f['rate'] / r['rate']:>6.1f}")
    print(f"\nCPU per repeat alert (same crash): {med([r['repeat_cpu'] for r in runs]) * 1000:.1f} ms; "
          f"CPU per new alert with a 5 MB log: {med([r['big_cpu'] for r in runs]) * 1000:.0f} ms")
    if bursts:
        floor_rate = med([run["floor"][levels[-1]]["rate"] for run in runs])
        print(f"\nburst: {args.burst} workloads crash at once ({args.burst_pods} pods), pod watch: first message "
              f"{med([b['first'] for b in bursts]):.2f} s, last {med([b['last'] for b in bursts]):.2f} s after the "
              f"crashes, at Slack's rate (1 post/s per channel): {med([b['top_level'] for b in bursts]):.0f} top-level "
              f"messages, {med([b['groups'] for b in bursts]):.0f} of them grouped, "
              f"{max(b['limited'] for b in bursts)} rate-limit answers; named per workload "
              f"{min(b['per_workload'][0] for b in bursts)}.."
              f"{max(b['per_workload'][1] for b in bursts)}; {med([b['cpu'] for b in bursts]) * 1000:.0f} ms CPU per "
              f"workload; RSS {med([b['rss'] for b in bursts]):.0f} MiB; the floor for the same requests at "
              f"{levels[-1]} senders: {args.burst / floor_rate:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
