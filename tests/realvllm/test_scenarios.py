"""Real vLLM 0.32 (CPU) in the loop, end to end through `serve`'s real wiring: a Deployment whose
pod is a real vLLM process (tests/kubeapi/realpod.py) crashes; the pod watch reports the first
crash; the bot diagnoses the real log, posts a proposal to Slack; a signed Approve click patches
the Deployment; the new ReplicaSet's pod is a new real process with the new spec; verification
waits for its Ready (its /health), reads vLLM's real KV-cache line, sends a real completion
request through the pod proxy, and soaks.

Each scenario prints its wall time (pytest -s, or the durations report). With
VLLM_ONCALL_WRITE_FIXTURES=1 (`make vllm-fixtures`) the real logs are kept as fixture bundles in
tests/fixtures/realvllm/.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime

import pytest
from realvllm_fixtures import keep_bundle
from realvllm_world import run_log, vllm_container

pytestmark = [pytest.mark.realvllm, pytest.mark.integration]

SMALL = ["--max-num-seqs", "2", "--max-num-batched-tokens", "2048", "--enforce-eager"]
CRASH_WAIT, VERIFY_WAIT = 300, 600
CAUSE_ABOVE_MODEL = "max-model-len-above-model"


def _args(container: dict) -> list[str]:
    return list(container.get("args") or [])


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def _verified_by_the_real_process(world, started: float) -> None:
    """Scenario 5's checks: the KV-cache line, the completion and the soak come from the real pod."""
    replies = world.replies()
    text = "\n".join(replies)
    new = world.newest()
    new_log = run_log(new)
    kv = re.search(r"2/4 vLLM: ([^;\n]+)", text)
    assert kv, text
    assert kv.group(1).split("] ")[-1] in new_log, "the KV-cache line is the real process's own"
    completion = re.search(r"3/4 a completion request to (\S+) \(model tiny-llama\) returned (\d+) tokens", text)
    assert completion and completion.group(1) == new.pod, text
    assert int(completion.group(2)) > 0
    assert "POST /v1/completions HTTP/1.1\" 200" in new_log, "the completion reached the real server"
    assert re.search(r"4/4 \S+: no restart and no crash in 5 s", text), text
    assert new.restarts == 0 and new.proc is not None and new.proc.poll() is None
    print(f"\nwall time: {time.monotonic() - started:.0f} s")


def test_kv_cache_too_small_for_max_model_len_is_fixed_and_verified_by_the_real_server(world_factory):
    """Scenarios 1 and 5: VLLM_CPU_KVCACHE_SPACE=1 GiB cannot hold one 131072-token request; vLLM
    says so and estimates what fits; the bot proposes that --max-model-len; the new pod serves."""
    started = time.monotonic()
    world = world_factory()
    world.deploy("tiny-kv", vllm_container(["--max-model-len", "131072", *SMALL]))
    post = world.wait_post(CRASH_WAIT)
    first = world.first()
    crash = world.snapshot(first.pod)
    assert first.last is not None and first.last.exit_code == 1
    previous = run_log(first)
    assert "To serve at least one request with the model's max seq len (131072)" in previous
    estimated = int(re.search(r"estimated maximum model length is (\d+)", previous).group(1))
    assert "max-model-len" in json.dumps(post)
    world.approve(post)
    state = world.wait_state({"verified", "failed"}, VERIFY_WAIT)
    assert state == "verified", world.logs()
    live = _args(world.live_container("tiny-kv"))
    new_len = int(_flag(live, "--max-model-len"))
    assert 0 < new_len <= estimated, (new_len, estimated)
    keep_bundle("kv-cache-max-model-len", world, previous, crash, {"cause": "kv-cache-max-model-len",
                                                                   "max_model_len_at_most": estimated})
    _verified_by_the_real_process(world, started)


def test_a_flag_this_vllm_no_longer_has_is_removed_and_verified(world_factory):
    """Scenario 2: --disable-log-requests (gone since 0.17) makes vLLM 0.32 exit at once."""
    started = time.monotonic()
    world = world_factory()
    world.deploy("tiny-flag", vllm_container(["--max-model-len", "1024", "--disable-log-requests", *SMALL]))
    post = world.wait_post(CRASH_WAIT)
    first = world.first()
    previous = run_log(first)
    assert "unrecognized arguments: --disable-log-requests" in previous
    keep_bundle("unrecognized-flag", world, previous, world.snapshot(first.pod), {"cause": "unrecognized-flag"})
    assert "--disable-log-requests" in json.dumps(post)
    world.approve(post)
    assert world.wait_state({"verified", "failed"}, VERIFY_WAIT) == "verified", world.logs()
    assert "--disable-log-requests" not in _args(world.live_container("tiny-flag"))
    _verified_by_the_real_process(world, started)


def test_max_model_len_above_what_the_model_supports_is_lowered_and_verified(world_factory):
    """Scenario 3: vLLM's own refusal of a --max-model-len above max_position_embeddings (2048)."""
    started = time.monotonic()
    world = world_factory()
    world.deploy("tiny-long", vllm_container(["--max-model-len", "4096", *SMALL], model="short"))
    post = world.wait_post(CRASH_WAIT)
    first = world.first()
    crash = world.snapshot(first.pod)
    previous = run_log(first)
    assert "max_model_len" in previous and "4096" in previous and "2048" in previous, previous[-2000:]
    assert "max-model-len" in json.dumps(post), json.dumps(post)[:2000]
    world.approve(post)
    assert world.wait_state({"verified", "failed"}, VERIFY_WAIT) == "verified", world.logs()
    new_len = int(_flag(_args(world.live_container("tiny-long")), "--max-model-len"))
    assert new_len <= 2048
    keep_bundle("max-model-len-above-model", world, previous, crash, {"cause": CAUSE_ABOVE_MODEL,
                                                                     "max_model_len_at_most": 2048})
    _verified_by_the_real_process(world, started)


def test_a_liveness_probe_that_kills_a_slow_start_gets_a_startup_probe_sized_from_the_load(world_factory):
    """Scenario 4: the liveness probe fails while vLLM is still starting, the kubelet SIGKILLs it
    (137, not OOMKilled); the bot adds a startupProbe sized from the observed load time.

    The liveness window (about 7 s: first probe at 5 s, two failures 2 s apart) is far below the
    shortest start-up this server can make: importing torch and vLLM alone takes longer on any
    machine, so the kill happens on an idle machine as on a busy one (a 50 s window did not: the
    tiny model was up inside it on an idle CI machine)."""
    started = time.monotonic()
    world = world_factory()
    liveness = {"httpGet": {"path": "/health", "port": 8000}, "initialDelaySeconds": 5, "periodSeconds": 2,
                "failureThreshold": 2, "timeoutSeconds": 1}
    world.deploy("tiny-probe", vllm_container(["--max-model-len", "1024", *SMALL], livenessProbe=liveness))
    post = world.wait_post(CRASH_WAIT)
    first = world.first()
    crash = world.snapshot(first.pod)
    assert first.last is not None and first.last.exit_code == 137 and first.last.reason == "Error"
    assert first.last.killed_by == "liveness"  # the restart that follows clears first.killed_by
    assert "startupProbe" in json.dumps(post), json.dumps(post)[:2000]
    world.approve(post)
    assert world.wait_state({"verified", "failed"}, VERIFY_WAIT) == "verified", world.logs()
    live = world.live_container("tiny-probe")
    probe = live["startupProbe"]
    # The kill time the kubelet recorded (the pod's lastState), which is what the bot reads.
    lived = (datetime.fromisoformat(first.last.finished) - datetime.fromisoformat(first.last.started)).total_seconds()
    window = probe["periodSeconds"] * probe["failureThreshold"]
    assert window >= max(600, 3 * lived), (probe, lived)  # sized from the observed kill time
    assert live["livenessProbe"] == liveness, "the liveness probe itself is left as it was"
    keep_bundle("probe-killed-during-load", world, run_log(first), crash, {"cause": "probe-killed-during-load"})
    _verified_by_the_real_process(world, started)


def test_a_server_that_dies_on_its_first_request_is_caught_by_the_completion_check(world_factory):
    """Scenario 6: head_dim 16. The fix for the first crash (--max-model-len above the model's 4096)
    makes a pod that is Ready, then dies on the verification's completion request: not verified,
    and the failure is diagnosed from the real log."""
    started = time.monotonic()
    world = world_factory()
    world.deploy("tiny-hd16", vllm_container(["--max-model-len", "8192", *SMALL], model="head16"))
    post = world.wait_post(CRASH_WAIT)
    world.approve(post)
    state = world.wait_state({"verified", "failed"}, VERIFY_WAIT)
    assert state == "failed", world.logs()
    text = "\n".join(world.replies())
    assert "1/4 New pod" in text, "the new pod did turn Ready"
    assert re.search(r"3/4 The new pod \S+ is Ready but does not serve: the completion request got HTTP 500", text), \
        text
    new = world.newest()
    new_log = run_log(new)
    assert "Unsupported CPU attention configuration: head_dim=16" in new_log
    replies = json.dumps([c.params for c in world.slack.replies()])
    assert "Unsupported CPU attention configuration: head_dim=16" in replies, "diagnosed from the real log"
    keep_bundle("dies-on-first-request", world, new_log, world.snapshot(new.pod), {"cause": None})
    print(f"\nwall time: {time.monotonic() - started:.0f} s")
