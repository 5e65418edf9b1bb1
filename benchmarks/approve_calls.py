"""How many times does one Approve walk cross a package boundary inside bot/?

One crash-looping Deployment on the Kubernetes API stand-in (its Deployment controller played by
the stand-in's on_write hook, the new pod a scripted vLLM behind the pod proxy), the Slack Web
API stand-in, and the bot wired as `serve` wires it (LiveCluster, KubeIncidentStore, SlackChat,
ServingChecks). The alert is handled first (not counted); then one approval is followed from the
click to `verified`: re-derivation, patch, audit record, Event, the Applied report, the rollout
(new pod Ready, vLLM's KV-cache line), a real completion request and a soak window.

A crossing is a call from a function in one bot/<package> into a function defined in another
bot/<package> (bot.app -> bot.kube, bot.kube -> bot.remedy, ...), counted with sys.setprofile on
the approving thread. Calls into the standard library, pydantic or the kubernetes client are not
crossings. The soak's clock is injected (each poll advances it), so the count does not depend on
the machine's speed. The soak window is one poll interval long (a longer soak adds 2 crossings
per further poll: the pod read and the verdict on it). Redaction remembers what it redacted
(bot/app/redaction.py): the alert, handled first in the same process, warms it, as it does in a
bot that took the alert itself; a replica that did not pays about 20 more.

Measured on this tree: 211 (233 with the redaction memo cold); before the decisions moved into
the core (bot/app/workload_ops.py, bot/app/verdict.py) and redaction remembered its work (main at
b0a44a0, this script): 438.

Run: python benchmarks/approve_calls.py [--by-pair]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the stand-ins live in tests/

from kubeapi.objects import container, crashing_deployment, rollout_controller  # noqa: E402
from kubeapi.server import FakeKube  # noqa: E402
from kubeapi.vllmpod import ScriptedVllm  # noqa: E402
from slackapi import SlackStandIn  # noqa: E402

from bot.app.records import AlertTarget  # noqa: E402
from bot.app.rollout import VerifySteps  # noqa: E402
from bot.app.service import OncallService, Policy  # noqa: E402
from bot.kube.api import KubeApi  # noqa: E402
from bot.kube.incidents import KubeIncidentStore  # noqa: E402
from bot.kube.live import LiveCluster  # noqa: E402
from bot.kube.retry import RetryPolicy  # noqa: E402
from bot.kube.verify import ServingChecks  # noqa: E402
from bot.slack.chat import SlackChat, make_client  # noqa: E402

BOT = ROOT / "bot"
NS, APPROVER = "inference", "U0APPROVER"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CRASH_LOG = """\
INFO 11-30 05:00:01 [core.py:76] Initializing a V1 LLM engine (v0.10.2) with config: model='m', max_seq_len=32768
ValueError: To serve at least one request with the models's max seq len (32768), (4.0 GiB KV cache is needed, which is larger than the available KV cache memory (2.34 GiB). Based on the available memory, the estimated maximum model length is 18432. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.
"""
READY_LOG = """\
INFO 11-30 05:10:01 [gpu_worker.py:298] Available KV cache memory: 10.55 GiB
INFO 11-30 05:10:01 [kv_cache_utils.py:1087] GPU KV cache size: 86,432 tokens
INFO 11-30 05:10:01 [kv_cache_utils.py:1091] Maximum concurrency for 18,432 tokens per request: 4.69x
"""


class StepClock:
    """A monotonic clock that moves only when the code under measure sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.001)


def package_of(filename: str) -> str | None:
    """"app" for .../bot/app/rollout.py; None outside bot/ (and for bot/__init__.py)."""
    try:
        parts = Path(filename).resolve().relative_to(BOT).parts
    except ValueError:
        return None
    return parts[0] if len(parts) > 1 else None


def count_crossings(walk: Callable[[], Any]) -> tuple[Any, Counter[tuple[str, str]]]:
    """Run `walk` on this thread and count the calls from one bot package into another."""
    crossings: Counter[tuple[str, str]] = Counter()
    packages: dict[str, str | None] = {}

    def pkg(frame: FrameType) -> str | None:
        name = frame.f_code.co_filename
        if name not in packages:
            packages[name] = package_of(name)
        return packages[name]

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or frame.f_back is None:
            return
        callee = pkg(frame)
        if callee is None:
            return
        caller = pkg(frame.f_back)
        if caller is not None and caller != callee:
            crossings[(caller, callee)] += 1

    sys.setprofile(profile)
    try:
        result = walk()
    finally:
        sys.setprofile(None)
    return result, crossings


class World:
    """The stand-ins and the bot as `serve` wires it, with one crashing Deployment alerted."""

    def __init__(self) -> None:
        self.kube, self.slack = FakeKube().start(), SlackStandIn().start()
        self.vllm = ScriptedVllm(model=MODEL).start()
        self.kube.default_pod_backend = self.vllm.url
        _, pod = crashing_deployment(self.kube, name="vllm-llama3-8b", namespace=NS, previous_log=CRASH_LOG,
                                     exit_code=1, containers=[container(command=["vllm", "serve", MODEL],
                                                                        args=["--max-model-len", "32768"])])
        self.kube.on_write = rollout_controller("ready", log=READY_LOG)
        api = KubeApi(self.kube.api_client(), retry=RetryPolicy(attempts=2, sleep=lambda s: None))
        clock = StepClock()
        probe = ServingChecks(api, poll_seconds=5.0, clock=clock, sleep=clock.sleep)
        chat = SlackChat(make_client("xoxb-calls", self.slack.url), "C0ALERTS", backoff_seconds=0.01)
        self.service = OncallService(LiveCluster(api, name="calls", poll_seconds=0.02),
                                     KubeIncidentStore(api, "vllm-oncall"), chat,
                                     Policy(approver_users=frozenset({APPROVER}), verify_timeout_seconds=10),
                                     metrics=chat.metrics,
                                     verify_steps=VerifySteps(probe=probe, request_timeout_seconds=5,
                                                              soak_seconds=5))
        incident = self.service.handle_alert(AlertTarget(namespace=NS, pod=pod["metadata"]["name"], container="vllm"))
        assert incident is not None and incident.state == "proposed", incident
        self.incident = incident.name

    def approve(self) -> str:
        return self.service.approve(self.incident, APPROVER)

    def state(self) -> str:
        incident = self.service.store.get(self.incident)
        return str(incident.state) if incident else "gone"

    def stop(self) -> None:
        for part in (self.vllm, self.slack, self.kube):
            part.stop()


def approve_walk_crossings() -> tuple[str, Counter[tuple[str, str]]]:
    """(the incident's state after the walk, the crossings of one Approve walk by package pair)."""
    world = World()
    try:
        outcome, crossings = count_crossings(world.approve)
        assert outcome == "applied", outcome
        return world.state(), crossings
    finally:
        world.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--by-pair", action="store_true", help="also print the count per package pair")
    args = parser.parse_args(argv)
    state, crossings = approve_walk_crossings()
    print(f"one Approve walk (click -> patch -> {state}): {sum(crossings.values())} cross-package calls")
    if args.by_pair:
        for (caller, callee), n in crossings.most_common():
            print(f"  {caller:>9} -> {callee:<9} {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
