"""ResolvedWorkloads (bot/kube/live.py): the workload objects workload_for read, kept for propose.
An entry is what was read: neither the caller that gave it nor one that got it can change it."""

from __future__ import annotations

from kubeapi.objects import container, deployment

from bot.kube.live import ResolvedWorkloads
from bot.remedy.models import WorkloadRef


def ref(version: str | None) -> WorkloadRef:
    return WorkloadRef(kind="Deployment", namespace="inference", name="llama", container="vllm",
                       resource_version=version)


def read(version: str = "41") -> dict:
    obj = deployment("llama", [container(args=["--max-model-len", "32768"])])
    obj["metadata"]["resourceVersion"] = version
    return obj


def test_an_entry_is_what_was_read_whoever_changes_their_copy():
    kept = ResolvedWorkloads()
    obj = read()
    kept.remember(ref("41"), obj)
    obj["spec"]["template"]["spec"]["containers"][0]["args"].append("--changed-by-the-giver")
    got = kept.get(ref("41"))
    assert got == read()
    got["spec"]["template"]["spec"]["containers"][0]["args"].append("--changed-by-the-getter")
    assert kept.get(ref("41")) == read()


def test_only_an_object_at_the_refs_own_version_is_kept_and_the_oldest_goes_first():
    kept = ResolvedWorkloads(size=2)
    kept.remember(ref("40"), read("41"))  # not the object at ref's version
    kept.remember(ref(None), read("41"))
    assert kept.get(ref("40")) is None and kept.get(ref(None)) is None
    for version in ("1", "2", "3"):
        kept.remember(ref(version), read(version))
    assert kept.get(ref("1")) is None
    assert [kept.get(ref(v))["metadata"]["resourceVersion"] for v in ("2", "3")] == ["2", "3"]
