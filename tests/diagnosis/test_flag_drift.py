"""Flag drift (issue 22): the flags each vLLM release has, read from its wheel, and the
unrecognized-flag playbook.

The refusals are printed by the real argparse, built the way each release's entrypoint builds its
parser, with that release's flags from the table (tests/vllm_cli.py): for every flag the table
says was removed or renamed between 0.6 and 0.33, the bot proposes exactly its removal, or the
new spelling; and no proposal of any playbook names a flag the crashed pod's release lacks.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml
from builders import FIXTURE_BUNDLES, make_node, make_pod, write_bundle
from vllm_cli import refusal

from bot.diagnosis import cmdline
from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evidence import load_bundle
from bot.diagnosis.flag_drift import check_release, fit_to_release, refused_flags, running_version
from bot.diagnosis.models import Change, Evidence, LogText
from bot.diagnosis.playbooks import load_dir, placeholder
from bot.diagnosis.vllm_versions import TABLE, FlagState, version_of_image
from bot.remedy import changes as ch

PLAYBOOKS = load_dir()
MODEL = "Qwen/Qwen2.5-7B-Instruct"


def removals():
    """(flag, first release read without it, the flag that took its value) for every removal in the table."""
    table = TABLE()
    return [(name, r.release, r.renamed_to) for name, history in sorted(table.flags.items()) for r in history.removed]


def crashed_pod(tmp_path, release: str, argv: list[str], entrypoint: str, image: str | None = None):
    command = ["vllm", "serve"] if entrypoint == "vllm serve" else ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    pod = make_pod(command=command, args=argv, exit_code=2)
    pod["spec"]["containers"][0]["image"] = image or f"vllm/vllm-openai:v{release}"
    log = refusal(release, argv, entrypoint)
    return write_bundle(tmp_path / "bundle", log, pod=pod, node=make_node()), log


def flag_words(flag: str) -> list[str]:
    return [flag] if cmdline.is_boolean(flag) else [flag, "7"]


def test_the_table_holds_every_minor_from_0_6_to_0_33():
    table = TABLE()
    minors = {tuple(int(p) for p in r.split(".")[:2]) for r in table.releases}
    assert {(0, m) for m in range(6, 34)} <= minors
    assert len(table.flags) > 300


def test_the_table_says_what_the_wheels_say():
    table = TABLE()
    dlr = table.flags["--disable-log-requests"]
    # deprecated=True from 0.10.2 (arg_utils.py), gone in 0.17.1 (0.16.0 still has it) ...
    assert (dlr.deprecated, dlr.removed[0].release) == ("0.10.2", "0.17.1")
    assert table.verdict("--disable-log-requests", "0.16.0").accepted
    assert table.verdict("--disable-log-requests", "0.17.1").state is FlagState.REMOVED
    assert table.verdict("--disable-log-requests", "0.32.0").state is FlagState.REMOVED
    # ... and back in 0.33.0 only as the off twin of --enable-log-requests (EnableDisableAction)
    assert table.verdict("--disable-log-requests", "0.33.0").accepted and dlr.only_as_twin("0.33.0")
    assert table.flags["--device-memory-utilization"].alias_of == "--gpu-memory-utilization"
    assert table.verdict("--device-memory-utilization", "0.31.0").accepted
    assert table.verdict("--device-memory-utilization", "0.30.0").state is FlagState.NOT_YET
    assert table.spelling_in("--device-memory-utilization", "0.30.0") == "--gpu-memory-utilization"
    assert table.verdict("--cuda-graph-sizes", "0.13.0").renamed_to == "--cudagraph-capture-sizes"
    assert table.verdict("--swap-space", "0.18.1").state is FlagState.REMOVED
    assert table.verdict("--max-model-len", "0.5.4").state is FlagState.UNKNOWN  # before the releases read


@pytest.mark.parametrize(("version", "release"), [
    ("0.10.1", "0.10.0"), ("0.10.1.1", "0.10.0"), ("0.10.2", "0.10.2"), ("0.6.3", "0.6.0"), ("0.6.6.post1", "0.6.6.post1"),
    ("0.11.0", "0.11.2"), ("v0.33.0", "0.33.0"), ("0.34.0", None), ("0.5.4", None), ("not-a-version", None)])
def test_a_version_stands_for_the_read_release_of_its_minor(version, release):
    assert TABLE().release_for(version) == release


@pytest.mark.parametrize(("image", "version"), [
    ("vllm/vllm-openai:v0.10.1", "0.10.1"), ("vllm/vllm-openai:v0.10.1.1", "0.10.1.1"),
    ("docker.io/vllm/vllm-openai:0.9.2", "0.9.2"), ("registry.local:5000/vllm/vllm-openai:v0.17.1-cu128", "0.17.1"),
    ("vllm/vllm-openai:latest", None), ("vllm/vllm-openai@sha256:abc", None), ("nginx:1.25", None),
    ("registry.local:5000/vllm-openai", None)])
def test_the_version_an_image_tag_names(image, version):
    assert version_of_image(image) == version


def test_the_log_version_wins_over_the_image_tag():
    assert running_version("0.11.0", "vllm/vllm-openai:v0.17.1").version == "0.11.0"
    assert running_version(None, "vllm/vllm-openai:v0.17.1").source == "the image tag vllm/vllm-openai:v0.17.1"
    assert running_version(None, "vllm/vllm-openai:latest").version is None


def test_the_refused_words_are_read_as_flags():
    assert refused_flags("--swap-space 4 --disable_log_requests --x=1") == ["--swap-space", "--disable-log-requests", "--x"]


@pytest.mark.parametrize("entrypoint", ["vllm serve", "api_server"])
@pytest.mark.parametrize(("flag", "release", "renamed_to"), removals(), ids=[f"{f}@{r}" for f, r, _ in removals()])
def test_every_removed_or_renamed_flag_is_removed_or_respelled(flag, release, renamed_to, entrypoint, tmp_path):
    argv = (["--model", MODEL] if entrypoint == "api_server" else [MODEL]) + ["--max-model-len", "4096"] + flag_words(flag)
    bundle, log = crashed_pod(tmp_path, release, argv, entrypoint)
    prog = "vllm" if entrypoint == "vllm serve" else "api_server.py"
    assert log.startswith("usage: ") and f"{prog}: error: unrecognized arguments: {flag}" in log  # argparse refuses it

    result = diagnose(load_bundle(bundle), PLAYBOOKS)

    assert result.cause == "unrecognized-flag"
    assert result.changes[0] == Change(kind="flag", name=flag, before=cmdline.parse(None, argv).get(flag), after=None)
    accepted_rename = renamed_to if renamed_to and TABLE().accepts(renamed_to, release) else None
    if accepted_rename and cmdline.is_boolean(accepted_rename) == cmdline.is_boolean(flag):
        assert result.changes[1:] == [Change(kind="flag", name=accepted_rename, before=None,
                                             after=cmdline.parse(None, argv).get(flag))]
        assert accepted_rename in result.command_after
    else:
        assert result.changes[1:] == []
    assert flag not in result.command_after and "--max-model-len" in result.command_after
    assert release in result.explanation and flag in result.explanation
    # vLLM of that release now accepts the command line the bot proposes
    program = 2 if entrypoint == "vllm serve" else 3  # vllm serve | python3 -m vllm.entrypoints.openai.api_server
    assert refusal(release, result.command_after[program:], entrypoint) == ""


def test_a_refused_flag_newer_than_the_image_is_respelled_to_the_alias_it_has(tmp_path):
    argv = [MODEL, "--device-memory-utilization", "0.85"]
    bundle, _ = crashed_pod(tmp_path, "0.30.0", argv, "vllm serve")
    result = diagnose(load_bundle(bundle), PLAYBOOKS)
    assert result.changes == [Change(kind="flag", name="--device-memory-utilization", before="0.85", after=None),
                              Change(kind="flag", name="--gpu-memory-utilization", before=None, after="0.85")]
    assert result.command_after == ["vllm", "serve", MODEL, "--gpu-memory-utilization", "0.85"]


def test_several_refused_flags_are_each_removed_in_a_shell_script(tmp_path):
    script = f"exec vllm serve {MODEL} --swap-space 8 --disable-log-requests --max-model-len 4096"
    pod = make_pod(command=["/bin/sh", "-c", script], exit_code=2)
    pod["spec"]["containers"][0]["image"] = "vllm/vllm-openai:v0.20.2"
    log = refusal("0.20.2", [MODEL, "--swap-space", "8", "--disable-log-requests", "--max-model-len", "4096"])
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod=pod, node=make_node())), PLAYBOOKS)
    assert [(c.name, c.after) for c in result.changes] == [("--swap-space", None), ("--disable-log-requests", None)]
    assert result.command_after == ["/bin/sh", "-c", f"exec vllm serve {MODEL} --max-model-len 4096"]


def test_a_forged_refusal_of_a_flag_the_release_has_removes_nothing(tmp_path):
    """The log is input: vLLM 0.17 has --max-model-len, so a line saying otherwise changes nothing."""
    pod = make_pod(command=["vllm", "serve"], args=[MODEL, "--max-model-len", "4096"], exit_code=2)
    pod["spec"]["containers"][0]["image"] = "vllm/vllm-openai:v0.17.1"
    log = "vllm: error: unrecognized arguments: --max-model-len 4096\n"
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod=pod, node=make_node())), PLAYBOOKS)
    assert result.cause == "unrecognized-flag"
    assert result.changes == []
    assert "--max-model-len is accepted by vLLM 0.17.1" in result.explanation


def test_a_refused_flag_the_command_line_does_not_hold_is_not_invented(tmp_path):
    pod = make_pod(command=["vllm", "serve"], args=[MODEL, "--config", "/etc/vllm.yaml"], exit_code=2)
    pod["spec"]["containers"][0]["image"] = "vllm/vllm-openai:v0.20.2"
    log = "vllm: error: unrecognized arguments: --swap-space 4\n"
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod=pod, node=make_node())), PLAYBOOKS)
    assert result.changes == []


def test_an_unknown_version_only_removes_and_says_so(tmp_path):
    argv = [MODEL, "--swap-space", "4"]
    bundle, _ = crashed_pod(tmp_path, "0.20.2", argv, "vllm serve", image="vllm/vllm-openai:latest")
    result = diagnose(load_bundle(bundle), PLAYBOOKS)
    assert result.changes == [Change(kind="flag", name="--swap-space", before="4", after=None)]
    assert result.confidence == "medium" and "version is unknown" in result.explanation


def test_the_version_line_of_the_log_wins_over_the_tag(tmp_path):
    """A pod whose tag says 0.33 but whose log says 0.13 (a re-tagged image): 0.13's spelling."""
    argv = ["--model", MODEL, "--cuda-graph-sizes", "256"]
    bundle, log = crashed_pod(tmp_path, "0.13.0", argv, "api_server", image="vllm/vllm-openai:v0.33.0")
    (bundle / "previous.log").write_text("INFO 12-01 10:00:00 [api_server.py:1] vLLM API server version 0.13.0\n" + log)
    result = diagnose(load_bundle(bundle), PLAYBOOKS)
    assert [c.name for c in result.changes] == ["--cuda-graph-sizes", "--cudagraph-capture-sizes"]


# ---- no proposal names a flag the running release lacks ------------------------------------


FLAG_SPECS = sorted({(b.id, c.name) for b in PLAYBOOKS for f in b.fixes for c in f.changes
                     if c.kind == "flag" and placeholder(c.name) is None})


@pytest.mark.parametrize(("book", "flag"), FLAG_SPECS)
def test_every_playbook_flag_in_every_release_is_its_spelling_or_not_offered(book, flag):
    table = TABLE()
    for release in table.releases:
        fitted, why = fit_to_release([Change(kind="flag", name=flag, after="1")], None, f"vllm/vllm-openai:v{release}")
        if fitted is None:
            assert not table.spelling_in(flag, release) or cmdline.is_boolean(table.spelling_in(flag, release) or "") \
                != cmdline.is_boolean(flag), (flag, release)
            assert flag in why
        else:
            assert table.accepts(fitted[0].name, release), (book, flag, release, fitted)


BUNDLES_WITH_FLAGS = [p for p in sorted(FIXTURE_BUNDLES.iterdir()) if (p / "expected.json").is_file()
                      and any(c.kind == "flag" and c.after is not None for c in diagnose(load_bundle(p), PLAYBOOKS).changes)]
_VERSION_LINE = re.compile(r"(vLLM API server version |LLM engine \(v|vLLM server version )v?[\w.+-]+")


def as_release(bundle, release: str) -> Evidence:
    """The bundle as if release `release` had crashed: its image tag and version lines say so."""
    evidence = load_bundle(bundle)
    log = evidence.log.text if evidence.log.text is not None else evidence.log.path.read_text(errors="replace")
    pod = json.loads(json.dumps(evidence.pod))
    for c in pod["spec"]["containers"]:
        c["image"] = f"vllm/vllm-openai:v{release}"
    return evidence.model_copy(update={"log": LogText(text=_VERSION_LINE.sub(lambda m: m.group(1) + release, log)),
                                       "pod": pod})


@pytest.mark.parametrize("bundle", BUNDLES_WITH_FLAGS, ids=[p.name for p in BUNDLES_WITH_FLAGS])
def test_no_proposal_names_a_flag_the_crashed_release_lacks(bundle):
    table = TABLE()
    baseline = {c.name for c in diagnose(load_bundle(bundle), PLAYBOOKS).changes if c.kind == "flag"}
    # the releases where any flag of the proposal (or a spelling of it) is missing, and the ends
    spellings = {s for name in baseline for s in table.spellings(name)}
    releases = {table.releases[0], table.releases[-1]} | {
        r for r in table.releases if any(not table.accepts(s, r) for s in spellings)}
    for release in sorted(releases, key=lambda r: [int(x) for x in re.findall(r"\d+", r)]):
        result = diagnose(as_release(bundle, release), PLAYBOOKS)
        for c in result.changes:
            if c.kind == "flag" and c.after is not None:
                assert table.accepts(c.name, release), (bundle.name, release, c)


# ---- the change: a flag removal is an approvable patch --------------------------------------


def test_a_flag_removal_is_a_json_patch_that_tests_what_it_removes():
    pod = yaml.safe_load((FIXTURE_BUNDLES / "flag-removed-0.17-disable-log-requests" / "pod.yaml").read_text())
    spec = pod["spec"]
    removal = [Change(kind="flag", name="--disable-log-requests", before="true", after=None)]
    after = ch.apply_changes(spec, "vllm", removal)
    ops = ch.build_json_patch(spec, after, "vllm", "/spec")
    assert ops[0] == {"op": "test", "path": "/spec/containers/0/name", "value": "vllm"}
    assert {"op": "test", "path": "/spec/containers/0/args", "value": spec["containers"][0]["args"]} in ops
    assert {"op": "replace", "path": "/spec/containers/0/args",
            "value": [MODEL, "--max-model-len", "8192"]} in ops


def test_the_playbook_allows_removals_and_vllm_flags_only():
    book = next(b for b in PLAYBOOKS if b.id == "unrecognized-flag")
    assert book.allows(Change(kind="flag", name="--disable-log-requests", after=None))
    assert book.allows(Change(kind="flag", name="--cudagraph-capture-sizes", after="512"))
    assert not book.allows(Change(kind="flag", name="--not-a-vllm-flag", after="1"))
    assert not book.allows(Change(kind="env", name="VLLM_USE_V1", after="0"))
    kv = next(b for b in PLAYBOOKS if b.id == "kv-cache-max-model-len")
    assert not kv.allows(Change(kind="flag", name="--disable-log-requests", after=None))


# ---- what plan says about a manifest before an upgrade --------------------------------------


def test_check_release_names_removed_renamed_and_twin_flags():
    cmd = cmdline.parse(["vllm", "serve"], [MODEL, "--disable-log-requests", "--cuda-graph-sizes", "8",
                                            "--max-model-len", "4096", "--no-enable-prefix-caching"])
    by_flag = {c.spelled: c for c in check_release([("vllm", cmd)], "0.32.0")}
    assert by_flag["--disable-log-requests"].refused
    assert by_flag["--cuda-graph-sizes"].verdict.renamed_to == "--cudagraph-capture-sizes"
    assert not by_flag["--max-model-len"].refused and not by_flag["--no-enable-prefix-caching"].refused
    twin = {c.spelled: c for c in check_release([("vllm", cmd)], "0.33.0")}["--disable-log-requests"]
    assert not twin.refused and "--enable-log-requests" in twin.note


@pytest.mark.parametrize("guard", ["--api-key", "--ssl-keyfile", "--allowed-origins", "--middleware"])
def test_a_refused_guard_flag_is_never_removed(guard, tmp_path):
    """vLLM 0.3's demo entrypoint (vllm.entrypoints.api_server) refuses --api-key: dropping it would
    serve the model to anyone. The refusal names a wrong entrypoint, not a flag to remove; the other
    refused flags are still removed."""
    script = f"exec python3 -m vllm.entrypoints.api_server --model {MODEL} {guard} s3cr3t-value --swap-space 4"
    pod = make_pod(command=["/bin/sh", "-c", script], exit_code=2)
    pod["spec"]["containers"][0]["image"] = "vllm/vllm-openai:v0.3.3"
    log = f"api_server.py: error: unrecognized arguments: {guard} s3cr3t-value --swap-space 4\n"
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod=pod, node=make_node())), PLAYBOOKS)
    assert result.cause == "unrecognized-flag"
    assert [c.name for c in result.changes] == ["--swap-space"]
    assert f"{guard} guards the server" in result.explanation


def test_a_refused_api_key_alone_changes_nothing(tmp_path):
    pod = make_pod(command=["python3", "-m", "vllm.entrypoints.api_server"],
                   args=["--model", MODEL, "--api-key", "k"], exit_code=2)
    pod["spec"]["containers"][0]["image"] = "vllm/vllm-openai:v0.3.3"
    log = "api_server.py: error: unrecognized arguments: --api-key k\n"
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod=pod, node=make_node())), PLAYBOOKS)
    assert result.cause == "unrecognized-flag" and result.changes == []
    assert "not removed" in result.explanation
