"""bot/changes.py: Changes -> pod spec, JSON Patch with test ops, manifest rewrite keeping layout."""

from __future__ import annotations

import copy
import re
import textwrap

import jsonpatch
import pytest

from bot.diagnosis.models import Change
from bot.remedy.changes import (
    ChangeError,
    apply_changes,
    build_json_patch,
    changed_fields,
    fields_of,
    manifest_diff,
    rewrite_manifest,
)

MAX_LEN = Change(kind="flag", name="--max-model-len", before="32768", after="8192")


def spec(**container) -> dict:
    return {"containers": [{"name": "sidecar", "image": "busybox"},
                           {"name": "vllm", "image": "vllm/vllm-openai", **container}]}


def vllm(pod_spec: dict) -> dict:
    return pod_spec["containers"][1]


# ---- every command-line shape, through the pod spec -------------------------------------------

@pytest.mark.parametrize("container, expected", [
    ({"command": ["vllm", "serve", "m", "--max-model-len", "32768"]},
     {"command": ["vllm", "serve", "m", "--max-model-len", "8192"]}),
    ({"args": ["--model", "m", "--max-model-len=32768"]}, {"args": ["--model", "m", "--max-model-len=8192"]}),
    ({"command": ["/bin/sh", "-c", "vllm serve m --max-model-len 32768 --port 8000"]},
     {"command": ["/bin/sh", "-c", "vllm serve m --max-model-len 8192 --port 8000"]}),
    ({"command": ["python", "-m", "vllm.entrypoints.openai.api_server"], "args": ["--model", "m", "--max_model_len",
                                                                                  "32768"]},
     {"command": ["python", "-m", "vllm.entrypoints.openai.api_server"], "args": ["--model", "m", "--max_model_len",
                                                                                  "8192"]}),
    ({"args": ["--max-model-len", "4096", "--model", "m", "--max-model-len=32768"]},
     {"args": ["--model", "m", "--max-model-len=8192"]}),  # duplicates collapse to the last spelling
    ({"command": ["bash", "-c"], "args": ["exec vllm serve m --max_model_len=32768"]},
     {"command": ["bash", "-c"], "args": ["exec vllm serve m --max_model_len=8192"]}),
    ({"args": ["--model", "m"]}, {"args": ["--model", "m", "--max-model-len", "8192"]}),  # added when absent
])
def test_flag_change_keeps_every_spelling(container, expected):
    before = spec(**container)
    after = apply_changes(before, "vllm", [MAX_LEN])
    assert {k: vllm(after).get(k) for k in ("command", "args") if k in vllm(after)} == expected
    assert before == spec(**container), "the input spec must not be modified"
    assert after["containers"][0] == before["containers"][0], "other containers are untouched"


def test_boolean_flag_added_and_removed():
    s = spec(args=["--model", "m", "--enforce-eager"])
    out = apply_changes(s, "vllm", [Change(kind="flag", name="--enforce-eager", before="true", after=None),
                                    Change(kind="flag", name="--enable-prefix-caching", after="true")])
    assert vllm(out)["args"] == ["--model", "m", "--enable-prefix-caching"]


def test_env_set_replace_dedupe_remove():
    s = spec(args=["--model", "m"], env=[{"name": "A", "value": "1"}, {"name": "B", "value": "x"},
                                         {"name": "A", "value": "2"}])
    out = apply_changes(s, "vllm", [Change(kind="env", name="A", after="3"),
                                    Change(kind="env", name="C", after="c"),
                                    Change(kind="env", name="B", after=None)])
    assert vllm(out)["env"] == [{"name": "A", "value": "3"}, {"name": "C", "value": "c"}]


def test_dev_shm_volume_added_with_mount():
    out = apply_changes(spec(args=["--model", "m"]), "vllm", [Change(kind="volume", name="/dev/shm", after="16Gi")])
    assert out["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]
    assert vllm(out)["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]


def test_dev_shm_existing_volume_resized_and_name_kept():
    s = spec(args=["--model", "m"], volumeMounts=[{"name": "shm", "mountPath": "/dev/shm"}])
    s["volumes"] = [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}, {"name": "dshm",
                                                                                             "emptyDir": {}}]
    out = apply_changes(s, "vllm", [Change(kind="volume", name="/dev/shm", before="1Gi", after="8Gi")])
    assert out["volumes"][0] == {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}
    assert vllm(out)["volumeMounts"] == [{"name": "shm", "mountPath": "/dev/shm"}]


def test_resources_gpu_request_follows_limit_and_memory_request_capped():
    s = spec(args=["--model", "m"], resources={"limits": {"nvidia.com/gpu": "1", "memory": "64Gi"},
                                               "requests": {"nvidia.com/gpu": "1", "memory": "64Gi"}})
    out = apply_changes(s, "vllm", [Change(kind="resources", name="limits.nvidia.com/gpu", after="2"),
                                    Change(kind="resources", name="limits.memory", after="48Gi")])
    assert vllm(out)["resources"] == {"limits": {"nvidia.com/gpu": "2", "memory": "48Gi"},
                                      "requests": {"nvidia.com/gpu": "2", "memory": "48Gi"}}
    with pytest.raises(ChangeError):
        apply_changes(s, "vllm", [Change(kind="resources", name="limits.memory", after="lots")])


def test_startup_probe_from_budget_reuses_liveness_handler():
    s = spec(args=["--model", "m"], livenessProbe={"httpGet": {"path": "/health", "port": 8080}, "periodSeconds": 5})
    out = apply_changes(s, "vllm", [Change(kind="probe", name="startupProbe", after="15m")])
    assert vllm(out)["startupProbe"] == {"httpGet": {"path": "/health", "port": 8080}, "periodSeconds": 10,
                                         "failureThreshold": 90}
    out = apply_changes(s, "vllm", [Change(kind="probe", name="livenessProbe.failureThreshold", after="30")])
    assert vllm(out)["livenessProbe"]["failureThreshold"] == 30


# ---- JSON Patch ---------------------------------------------------------------------------------

def test_json_patch_tests_every_changed_field_and_applies_with_jsonpatch():
    s = spec(args=["--model", "m", "--max-model-len", "32768"])
    after = apply_changes(s, "vllm", [MAX_LEN, Change(kind="volume", name="/dev/shm", after="8Gi")])
    ops = build_json_patch(s, after, "vllm", base="/spec", resource_version="41")
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "41"}
    assert {"op": "test", "path": "/spec/containers/1/name", "value": "vllm"} in ops
    assert {"op": "test", "path": "/spec/containers/1/args", "value": s["containers"][1]["args"]} in ops
    assert {"op": "add", "path": "/spec/volumes", "value": after["volumes"]} in ops
    pod = {"metadata": {"resourceVersion": "41"}, "spec": copy.deepcopy(s)}
    assert jsonpatch.apply_patch(pod, ops)["spec"] == after
    edited = copy.deepcopy(pod)
    edited["spec"]["containers"][1]["args"].append("--enforce-eager")
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(edited, ops)
    assert changed_fields(fields_of(s, "vllm"), fields_of(after, "vllm")) == ["args", "volumeMounts", "volumes"]


def test_manifest_diff_shows_before_and_after():
    workload = {"kind": "Deployment", "metadata": {"name": "llama"},
                "spec": {"template": {"spec": spec(args=["--max-model-len", "32768"])}}}
    diff = manifest_diff(workload, apply_changes(workload["spec"]["template"]["spec"], "vllm", [MAX_LEN]), "vllm")
    assert "-- '32768'" in diff and "+- '8192'" in diff


# ---- manifest files: ruamel round trip ------------------------------------------------------------

MANIFEST = textwrap.dedent("""\
    # Llama on one A10G. Owner: ml-platform
    apiVersion: apps/v1
    kind: Deployment
    metadata:
      name: llama   # keep this name: dashboards use it
      namespace: inference
    spec:
      replicas: 1
      selector:
        matchLabels: {app: llama}
      template:
        metadata:
          labels:
            app: llama
        spec:
          containers:
            - name: vllm
              image: "vllm/vllm-openai:v0.11.0"
              args:
                - --model
                - meta-llama/Llama-3.1-8B-Instruct   # the model
                - --max-model-len=32768  # was 8k last quarter
                - --port
                - '8000'
              resources:
                limits:
                  nvidia.com/gpu: 1
    """)


def test_rewrite_manifest_keeps_comments_order_quotes_and_indentation():
    new_text, touched = rewrite_manifest(MANIFEST, [MAX_LEN])
    assert touched == ["args"]
    expected = MANIFEST.replace("--max-model-len=32768", "--max-model-len=8192")
    # ruamel keeps an end-of-line comment at its column, so only the blanks before it may differ
    assert re.sub(r" +#", " #", new_text) == re.sub(r" +#", " #", expected)


def test_rewrite_manifest_shell_block_scalar_stays_a_block_and_new_fields_are_added():
    text = textwrap.dedent("""\
        apiVersion: apps/v1
        kind: StatefulSet
        metadata:
          name: qwen
        spec:
          template:
            spec:
              containers:
              - name: vllm
                command: ["/bin/sh", "-c"]
                args:
                - |
                  vllm serve Qwen/Qwen2.5-7B --max-model-len 32768 --port 8000
        """)
    new_text, touched = rewrite_manifest(text, [MAX_LEN, Change(kind="volume", name="/dev/shm", after="8Gi")])
    assert "- |\n          vllm serve Qwen/Qwen2.5-7B --max-model-len 8192 --port 8000" in new_text
    assert 'command: ["/bin/sh", "-c"]' in new_text
    assert "mountPath: /dev/shm" in new_text and "sizeLimit: 8Gi" in new_text
    assert touched == ["args", "volumeMounts", "volumes"]


def test_rewrite_manifest_without_a_workload_is_an_error():
    with pytest.raises(ChangeError):
        rewrite_manifest("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", [MAX_LEN])


# ---- properties: the patch makes exactly the new spec, and a rollback restores exactly the old one ----

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from bot.remedy import plan  # noqa: E402

FLAG_SPELLINGS = st.sampled_from(["--max-model-len", "--max_model_len"])
VALUES = st.integers(min_value=1, max_value=131072).map(str)


@st.composite
def containers(draw):
    """A vLLM container in one of the shapes manifests use, with zero to two uses of the flag."""
    uses = draw(st.lists(st.tuples(FLAG_SPELLINGS, VALUES, st.booleans()), max_size=2))
    words = ["--model", "m"]
    for spelling, value, inline in uses:
        words += [f"{spelling}={value}"] if inline else [spelling, value]
    shape = draw(st.sampled_from(["serve-command", "args", "shell", "api_server"]))
    if shape == "serve-command":
        c = {"command": ["vllm", "serve"] + words[1:]}
    elif shape == "args":
        c = {"args": words}
    elif shape == "shell":
        c = {"command": ["/bin/sh", "-c", "exec vllm serve " + " ".join(words[1:])]}
    else:
        c = {"command": ["python3", "-m", "vllm.entrypoints.openai.api_server"], "args": words}
    if draw(st.booleans()):
        c["env"] = [{"name": "HF_HOME", "value": "/cache"}]
    return {"name": "vllm", "image": "vllm/vllm-openai", **c}


@settings(max_examples=150, deadline=None)
@given(c=containers(), new_value=VALUES, shm=st.one_of(st.none(), st.sampled_from(["2Gi", "16Gi"])))
def test_patch_then_rollback_round_trips(c, new_value, shm):
    workload = {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "w", "namespace": "ns", "resourceVersion": "7", "generation": 3},
                "spec": {"template": {"spec": {"containers": [{"name": "side", "image": "x"}, c]}}}}
    changes = [Change(kind="flag", name="--max-model-len", after=new_value)]
    if shm:
        changes.append(Change(kind="volume", name="/dev/shm", after=shm))
    before_spec = workload["spec"]["template"]["spec"]
    after_spec = apply_changes(before_spec, "vllm", changes)
    ops = build_json_patch(before_spec, after_spec, "vllm", resource_version="7")
    patched = jsonpatch.apply_patch(workload, ops)
    assert patched["spec"]["template"]["spec"] == after_spec
    from bot.diagnosis.cmdline import parse

    vllm_after = after_spec["containers"][1]
    assert parse(vllm_after.get("command"), vllm_after.get("args")).get("--max-model-len") == new_value

    record = plan.audit_record("change", "p1", "me", "kv", "vllm", fields_of(before_spec, "vllm"),
                               fields_of(after_spec, "vllm"))
    patched = jsonpatch.apply_patch(patched, plan.audit_ops(patched, [record]))
    rollback, _ = plan.rollback_ops(patched, "you")
    restored = jsonpatch.apply_patch(patched, rollback)
    assert restored["spec"]["template"]["spec"] == before_spec


def test_before_values_are_read_from_the_live_spec_where_it_sets_them():
    from bot.remedy.changes import with_live_before

    spec = {"containers": [{"name": "vllm", "command": ["vllm", "serve", "m"], "args": ["--max-model-len=30000"],
                            "env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"},
                                    {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
                            "resources": {"limits": {"memory": "40Gi"}}}]}
    changes = [Change(kind="flag", name="--max-model-len", before="32768", after="18432"),
               Change(kind="flag", name="--enforce-eager", before="false", after="true"),
               Change(kind="env", name="A", before="9", after="3"),
               Change(kind="env", name="S", before="x", after="y"),
               Change(kind="env", name="NEW", before="old", after="v"),
               Change(kind="resources", name="limits.memory", before="32Gi", after="48Gi")]
    got = {(c.kind, c.name): c.before for c in with_live_before(spec, "vllm", changes)}
    assert got == {("flag", "--max-model-len"): "30000",  # the live value, not the crashed pod's
                   ("flag", "--enforce-eager"): "false",  # not set live: the diagnosis' effective value
                   ("env", "A"): "2",  # the last definition is the one the kubelet uses
                   ("env", "S"): "x",  # from a Secret: not read here
                   ("env", "NEW"): None, ("resources", "limits.memory"): "40Gi"}
    assert [c.after for c in with_live_before(spec, "vllm", changes)] == [c.after for c in changes]
