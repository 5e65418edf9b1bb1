"""The RBAC the bot needs is listed once (bot/kube/rbac.py REQUIRED) and cannot drift:
(a) deploy/overlays/approve grants exactly REQUIRED, the default deploy/ (proposals-only) exactly
REQUIRED minus APPROVE_ONLY; (b) every call the code makes against the API stand-in, over a
whole incident (collect, propose with dry run, apply, verify, roll back, incidents), is in REQUIRED,
and every REQUIRED permission is used."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from kubeapi.objects import container, crashing_deployment, deployment, rollout_controller, start_pod
from manifests import DEPLOY, built_objects

from bot.diagnosis.models import Change, DiagnosisResult
from bot.kube.api import KubeApi
from bot.kube.live import LiveCluster
from bot.kube.rbac import REQUIRED, proposals_only_set, required_set
from bot.kube.retry import RetryPolicy

NS = "inference"


def granted(folder=DEPLOY) -> set[tuple[str, str, str]]:
    """(verb, apiGroup, resource) from every Role/ClusterRole bound to the bot's ServiceAccount."""
    docs = built_objects(folder)
    bound = {(b["roleRef"]["kind"], b["roleRef"]["name"]) for b in docs
             if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
             and any(s["kind"] == "ServiceAccount" and s["name"] == "vllm-oncall" for s in b["subjects"])}
    out = set()
    for role in docs:
        if role["kind"] in ("Role", "ClusterRole") and (role["kind"], role["metadata"]["name"]) in bound:
            for rule in role["rules"]:
                assert "*" not in rule["verbs"] and "*" not in rule["resources"], "no wildcards"
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        out |= {(verb, group, resource) for verb in rule["verbs"]}
    return out


def test_deploy_manifests_grant_exactly_what_the_code_requires():
    assert granted(DEPLOY / "overlays" / "approve") == required_set()
    # the default install is read-only (issue 17): no patch, no pods/proxy, no Event written
    assert granted() == proposals_only_set()


def test_required_has_no_secrets_and_no_deletes():
    for _group, resource, verbs in REQUIRED:
        assert resource != "secrets" and "delete" not in verbs and "*" not in verbs


def test_every_call_the_code_makes_is_required_and_every_required_permission_is_used(kube_api):
    api = KubeApi(kube_api.api_client(), retry=RetryPolicy(initial=0.001, maximum=0.002, sleep=lambda s: None))
    cluster = LiveCluster(api, name="rbac", poll_seconds=0.001)
    change = Change(kind="flag", name="--max-model-len", before="32768", after="8192")
    result = DiagnosisResult(cause="kv-cache-max-model-len", title="t", explanation="e", changes=[change])

    # A Deployment: find by workload name, collect, propose (dry run), apply, verify, roll back.
    _, pod = crashing_deployment(kube_api, containers=[container(args=["--model", "m", "--max-model-len", "32768"])],
                                 previous_log="boom\n")
    kube_api.on_write = rollout_controller("ready", log="GPU KV cache size: 1,000 tokens\n")
    name = cluster.resolve_pod(NS, "llama")
    evidence = cluster.collect(NS, name)
    applied = cluster.apply(cluster.propose(result, evidence), "U_ALICE")
    assert applied.ok
    assert cluster.verify(applied.workload, 5).outcome == "ready"
    assert cluster.rollback(NS, "Deployment", "llama", "U_BOB").ok

    # A StatefulSet, resolved by name too.
    sts = deployment("qwen", [container(args=["--model", "q", "--max-model-len", "32768"])], NS)
    sts["kind"], sts["spec"]["serviceName"] = "StatefulSet", "qwen"
    sts_pod = start_pod(kube_api, kube_api.put(sts), "crashloop", previous_log="boom\n", suffix="0")
    assert cluster.resolve_pod(NS, "qwen") == sts_pod["metadata"]["name"]
    assert cluster.apply(cluster.propose(result, cluster.collect(NS, sts_pod["metadata"]["name"])), "U_ALICE").ok

    # A bare ReplicaSet's pod: no Deployment name to go by, so its ReplicaSet itself is read.
    rs = deployment("solo", [container(args=["--model", "s"])], NS)
    rs["kind"] = "ReplicaSet"
    rs_pod = start_pod(kube_api, kube_api.put(rs), "crashloop", previous_log="boom\n")
    assert cluster.workload_for(cluster.collect(NS, rs_pod["metadata"]["name"])).kind == "ReplicaSet"

    # The incident store the Slack side uses (bot/incidents.py), when it is there.
    try:
        from bot.kube.incidents import KubeIncidentStore
    except ImportError:
        KubeIncidentStore = None
    if KubeIncidentStore is not None:
        from bot.app.records import Incident

        store = KubeIncidentStore(KubeApi(kube_api.api_client()), "vllm-oncall")
        now = datetime.now(UTC)
        made = store.create(Incident(name="i", cluster="rbac", namespace=NS, workload="llama", cause="kv",
                                     state="proposed", first_seen=now, last_seen=now))
        store.update(made.model_copy(update={"state": "approved"}))
        assert store.get("i") is not None and store.list(state="approved")

    # Verification's completion request, through the pod proxy (bot/kube/verify.py ServingChecks).
    from kubeapi.vllmpod import ScriptedVllm

    from bot.kube.verify import ServingChecks

    vllm = ScriptedVllm(model="q").start()  # the StatefulSet's --model q
    kube_api.default_pod_backend = vllm.url
    try:
        sts_ref = cluster.workload_for(cluster.collect(NS, sts_pod["metadata"]["name"]))
        assert ServingChecks(api).ask(sts_ref.model_copy(update={"container": "vllm"}),
                                      sts_pod["metadata"]["name"], 5).ok
        no_model = container(args=["--port", "8000"])
        bare = kube_api.put(deployment("bare", [no_model], NS))
        bare_pod = start_pod(kube_api, bare, "ready", suffix="b")["metadata"]["name"]
        assert ServingChecks(api).ask(sts_ref.model_copy(update={"name": "bare"}), bare_pod, 5).ok  # via /v1/models
    finally:
        vllm.stop()

    # The pod watch (bot/kube/watch.py): list, then watch from the list's resourceVersion.
    from bot.kube.watch import PodWatch, WatchSettings

    watcher = PodWatch(api, lambda crash: None, WatchSettings(namespaces=(NS,), timeout_seconds=1)).start()
    assert kube_api.wait_for_watchers(1)
    watcher.stop()

    called = kube_api.called()
    assert called <= required_set(), f"called but not in REQUIRED: {sorted(called - required_set())}"
    if KubeIncidentStore is not None:
        assert required_set() <= called, f"REQUIRED but never used: {sorted(required_set() - called)}"


def test_a_missing_permission_is_reported_by_name(kube_api):
    """What an operator sees when deploy/rbac.yaml was trimmed: the verb and resource to add."""
    from bot.kube.errors import KubeForbidden

    api = KubeApi(kube_api.api_client())
    crashing_deployment(kube_api)
    kube_api.fail("get", "deployments", 403)
    with pytest.raises(KubeForbidden) as info:
        api.get_workload("Deployment", NS, "llama")
    assert "may not get deployments.apps in namespace inference" in str(info.value)


def test_the_permission_table_in_deploy_readme_matches_required():
    rows = set()
    for line in (DEPLOY / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] in ('""', "apps", "oncall.vllm.ai"):
            group = "" if cells[0] == '""' else cells[0]
            for resource in cells[1].split(","):
                rows |= {(verb.strip(), group, resource.strip()) for verb in cells[2].split(",")}
    assert rows == required_set()
