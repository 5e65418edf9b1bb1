"""Typed errors: KubeApi turns every failed call into one bot.kube.errors type, once, and nothing
else in the bot looks at status codes or the client's ApiException."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from kubeapi.objects import crashing_deployment

from bot.app.errors import ClusterError, ClusterForbidden, ClusterUnavailable
from bot.app.ports import PodNotFound
from bot.diagnosis.models import Change, DiagnosisResult
from bot.kube.api import KubeApi
from bot.kube.errors import (
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    KubeUnavailable,
    PodGone,
    PreviousLogGone,
)
from bot.kube.live import LiveCluster
from bot.kube.retry import RetryPolicy

BOT = Path(__file__).resolve().parents[2] / "bot"
NS = "inference"
MAX_LEN = DiagnosisResult(cause="kv-cache-max-model-len", title="t", explanation="e", changes=[
    Change(kind="flag", name="--max-model-len", before="32768", after="8192")])


@pytest.fixture
def api(kube_api):
    return KubeApi(kube_api.api_client(), retry=RetryPolicy(attempts=2, initial=0.001, sleep=lambda s: None))


@pytest.mark.parametrize("code, expected", [
    (404, KubeNotFound), (409, KubeConflict), (403, KubeForbidden), (500, KubeUnavailable), (503, KubeUnavailable),
    (429, KubeUnavailable), (401, KubeError)])
def test_each_status_becomes_one_typed_error(kube_api, api, code, expected):
    crashing_deployment(kube_api)
    kube_api.fail("get", "deployments", code)
    with pytest.raises(KubeError) as info:
        api.get_workload("Deployment", NS, "llama")
    assert type(info.value) is expected and info.value.status == code
    assert "\n" not in str(info.value)


def test_missing_object_is_not_found_and_find_workload_says_none(api):
    with pytest.raises(KubeNotFound) as info:
        api.get_pod(NS, "nope")
    assert info.value.reason == "NotFound" and str(info.value).startswith("Kubernetes API error 404: ")
    assert api.find_workload("Deployment", NS, "nope") is None


def test_validation_is_invalid_and_a_failed_test_op_is_a_conflict(kube_api, api):
    crashing_deployment(kube_api)
    with pytest.raises(KubeInvalid):
        api.patch_workload("Deployment", NS, "llama", [{"op": "replace", "path": "/spec/replicas", "value": "x"}])
    with pytest.raises(KubeConflict) as info:
        api.patch_workload("Deployment", NS, "llama", [{"op": "test", "path": "/spec/replicas", "value": 9}])
    assert info.value.status == 422


def test_previous_log_gone_is_its_own_not_found(kube_api, api):
    _, pod = crashing_deployment(kube_api)
    kube_api.logs.pop((NS, pod["metadata"]["name"], "vllm", True))
    with pytest.raises(PreviousLogGone) as info:
        api.read_log(NS, pod["metadata"]["name"], "vllm", previous=True)
    assert "previous terminated container" in info.value.server_message
    with pytest.raises(KubeInvalid):  # the same 400 about the current log is not "gone"
        api.read_log(NS, pod["metadata"]["name"], "no-such-container", previous=False)


def test_the_application_sees_port_level_types():
    assert issubclass(KubeForbidden, ClusterForbidden) and issubclass(KubeUnavailable, ClusterUnavailable)
    assert all(issubclass(t, ClusterError) for t in (KubeError, KubeNotFound, KubeConflict, KubeInvalid))
    assert issubclass(PodGone, PodNotFound)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update({node.module, *(f"{node.module}.{a.name}" for a in node.names)})
    return names


def _http_status_checks(tree: ast.AST) -> list[int]:
    """Lines comparing `<something>.status` with a number (or numbers), e.g. `exc.status == 404`."""
    def numbers(node: ast.AST) -> bool:
        items = node.elts if isinstance(node, (ast.Tuple, ast.Set, ast.List)) else [node]
        return any(isinstance(i, ast.Constant) and isinstance(i.value, int) for i in items)

    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Compare) and isinstance(n.left, ast.Attribute)
            and n.left.attr == "status" and any(numbers(c) for c in n.comparators)]


def test_only_the_api_wrapper_touches_the_clients_exceptions():
    # retry.py decides what to retry from the client's exception, inside KubeApi._call.
    allowed = {BOT / "kube" / "api.py", BOT / "kube" / "retry.py"}
    for path in sorted(set(BOT.rglob("*.py")) - allowed):
        tree = ast.parse(path.read_text())
        names = _imports(path) | {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert not {n for n in names if n.endswith("ApiException") or n.startswith("kubernetes.client.exceptions")}, \
            f"{path} uses the client's ApiException"
        assert not _http_status_checks(tree), f"{path} checks HTTP status codes at lines {_http_status_checks(tree)}"


def test_the_application_imports_no_adapter():
    for path in (BOT / "app").glob("*.py"):
        bad = {n for n in _imports(path) if n.startswith(("bot.kube", "kubernetes"))}
        assert not bad, f"{path.name} imports {sorted(bad)}"


# ---- propose builds on the object workload_for read -------------------------------------------------

def test_propose_reads_no_owner_again_and_binds_to_what_was_resolved(kube_api, api):
    _, pod = crashing_deployment(kube_api)
    cluster = LiveCluster(api, name="c")
    evidence = cluster.collect(NS, pod["metadata"]["name"])
    workload = cluster.workload_for(evidence)
    before = len(kube_api.calls)
    proposal = cluster.propose(MAX_LEN, evidence, workload)
    calls = [(c.verb, c.resource, c.dry_run) for c in kube_api.calls[before:]]
    assert calls == [("patch", "deployments", True)]
    assert proposal.dry_run_ok and proposal.workload.resource_version == workload.resource_version
    assert {"op": "test", "path": "/metadata/resourceVersion", "value": workload.resource_version} \
        in proposal.json_patch


def test_propose_for_a_workload_this_cluster_did_not_resolve_reads_it(kube_api, api):
    _, pod = crashing_deployment(kube_api)
    resolver = LiveCluster(api, name="c")
    evidence = resolver.collect(NS, pod["metadata"]["name"])
    workload = resolver.workload_for(evidence)
    kube_api.edit("Deployment", "llama", NS, lambda d: d["metadata"].setdefault("labels", {}).update(team="x"))
    other = LiveCluster(api, name="c")  # e.g. another replica: nothing remembered
    proposal = other.propose(MAX_LEN, evidence, workload)
    latest = kube_api.get("Deployment", "llama", NS)["metadata"]["resourceVersion"]
    assert proposal.workload.resource_version == latest != workload.resource_version
    assert proposal.dry_run_ok is True


def test_a_stale_resolution_fails_its_dry_run_instead_of_patching_blind(kube_api, api):
    _, pod = crashing_deployment(kube_api)
    cluster = LiveCluster(api, name="c")
    evidence = cluster.collect(NS, pod["metadata"]["name"])
    workload = cluster.workload_for(evidence)
    kube_api.edit("Deployment", "llama", NS, lambda d: d["metadata"].setdefault("labels", {}).update(team="x"))
    proposal = cluster.propose(MAX_LEN, evidence, workload)  # built on what was resolved, checked live
    assert proposal.dry_run_ok is False and "testing value" in proposal.dry_run_message
