"""`/vllm why` answers from the evidence kept with the incident once the previous log is gone
(bot/app/evidence_cache.py), through the real service, incident store and clients."""

from __future__ import annotations

from datetime import UTC, datetime

from kubeapi.server import FakeKube
from test_pod_watch import EXAMPLE_LOG, NS, crash, make_service, running_vllm

from bot.app import evidence_cache
from bot.app.records import AlertTarget
from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.models import Evidence, LogText


def restarted_twice(kube: FakeKube, pod: str) -> None:
    """Two more restarts: the kubelet keeps only the last previous log, of a run that did not crash
    the way the first one did; the current container is loading again."""
    with kube.lock:
        del kube.logs[(NS, pod, "vllm", True)]  # gone
    kube.set_log(NS, pod, "vllm", "INFO 11-30 05:30:00 [api_server.py:1839] vLLM API server version 0.10.2\n",
                 previous=False)
    kube.edit("Pod", pod, NS, lambda o: o["status"]["containerStatuses"][0].update(restartCount=3))


def test_why_answers_from_the_kept_evidence_when_the_previous_log_is_gone(kube_api, slack):
    pod = running_vllm(kube_api, "vllm-llama3-8b")
    crash(kube_api, pod)
    service = make_service(kube_api, slack)
    opened = service.handle_alert(AlertTarget(namespace=NS, pod=pod, container="vllm"))
    assert opened is not None and opened.cause and opened.evidence is not None
    assert "Traceback" in opened.evidence.log_text or "Error" in opened.evidence.log_text

    restarted_twice(kube_api, pod)
    fresh = service.cluster.collect(NS, pod)
    assert evidence_cache.previous_log_gone(fresh)
    assert service.diagnose(fresh).cause != opened.cause  # without the kept evidence: another answer

    answer = service.answer_why(f"{NS}/vllm-llama3-8b", "C0WHY", "U0A")
    assert answer is not None and answer.cause == opened.cause and answer.name == opened.name
    said = [r.params.get("text", "") for r in slack.replies()]
    assert any("collected at" in text and "kept with the incident" in text for text in said), said


def test_why_without_kept_evidence_says_nothing_about_it(kube_api, slack):
    pod = running_vllm(kube_api, "vllm-llama3-8b")
    crash(kube_api, pod)
    restarted_twice(kube_api, pod)
    service = make_service(kube_api, slack)
    service.answer_why(f"{NS}/vllm-llama3-8b", "C0WHY", "U0A")
    assert not any("kept with the incident" in r.params.get("text", "") for r in slack.replies())


def test_kept_evidence_is_bounded_and_diagnoses_as_the_original():
    now = datetime.now(UTC)
    pod = {"metadata": {"name": "p", "namespace": NS, "managedFields": [{"big": "x" * 10_000}]},
           "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.10.2",
                                    "args": ["--max-model-len", "32768"]}]}}
    small = Evidence(log=LogText(text=EXAMPLE_LOG), pod=pod, container="vllm")
    kept = evidence_cache.keep(small, now)
    assert kept is not None and "managedFields" not in kept.pod["metadata"]
    assert diagnose(evidence_cache.restore(kept)).cause == diagnose(small).cause
    lines = EXAMPLE_LOG.splitlines(keepends=True)
    huge = Evidence(log=LogText(text=lines[0] * 200_000 + "".join(lines)), pod=pod, container="vllm")
    kept = evidence_cache.keep(huge, now)
    assert kept is not None and kept.truncated_middle
    assert len(kept.log_text) <= evidence_cache.HEAD_CHARS + evidence_cache.TAIL_CHARS + len(evidence_cache.MIDDLE)
    assert kept.log_text.endswith(EXAMPLE_LOG[-1000:])
