"""Playbook files: validated at load, a typo names the file and the field."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import yaml
from builders import make_pod, write_bundle

from bot.diagnosis.cmdline import BOOLEAN_FLAGS
from bot.diagnosis.playbooks import (
    DEFAULT_DIR,
    PlaybookError,
    load_dir,
    load_file,
    load_playbooks,
    longest_literal,
    placeholder,
    vllm_names,
)

GOOD = """\
id: my-cause
title: A title
summary: one line
priority: 100
when:
  - log: 'Something specific happened'
explanation: it happened
fixes:
  - changes:
      - {kind: flag, name: --enforce-eager, value: enforce_eager_on}
"""


def test_every_bundled_file_is_one_playbook_most_specific_first():
    books = load_dir()
    assert sorted(b.id for b in books) == sorted(p.stem for p in DEFAULT_DIR.glob("*.yaml"))
    assert [b.priority for b in books] == sorted((b.priority for b in books), reverse=True)
    # the first match wins: two causes at one priority would be ordered by accident
    assert len({b.priority for b in books}) == len(books)


def write(tmp_path: Path, text: str, name: str = "my-cause.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_good_playbook_loads(tmp_path):
    book = load_file(write(tmp_path, GOOD))
    assert book.allowed() == {("flag", "--enforce-eager")}
    assert book.literals() == ["Something specific happened"]


@pytest.mark.parametrize("broken, field, words", [
    (GOOD.replace("explanation:", "explanaton:"), "explanaton", "unknown field"),
    (GOOD.replace("value: enforce_eager_on", "value: enforce_eager_onn"), "fixes.0.changes.0.value", "did you mean 'enforce_eager_on'"),
    (GOOD.replace("- log: 'Something specific happened'", "- signal: oom_anyy"), "when.0", "unknown signal 'oom_anyy'"),
    (GOOD.replace("'Something specific happened'", "'(unclosed'"), "when.0", "not a valid regex"),
    (GOOD.replace("'Something specific happened'", "'\\d+ x'"), "when.0", "no literal of 4+ characters"),
    (GOOD.replace("name: --enforce-eager", "name: --enforce_eager"), "fixes.0.changes.0.name", "--dash-form"),
    (GOOD.replace("kind: flag", "kind: flags"), "fixes.0.changes.0.kind", "Input should be"),
    (GOOD.replace("priority: 100", "priority: lots"), "priority", "valid integer"),
    # flags, env variables and resources are checked against what vLLM and Kubernetes take
    (GOOD.replace("name: --enforce-eager", "name: --rm-rf"), "fixes.0.changes.0.name", "'--rm-rf' is not a vLLM flag"),
    (GOOD.replace("name: --enforce-eager", "name: --max-modle-len"), "fixes.0.changes.0.name",
     "did you mean '--max-model-len'"),
    (GOOD.replace("kind: flag, name: --enforce-eager", "kind: env, name: VLLM_WORKER_MULTIPROC_METHD"),
     "fixes.0.changes.0.name", "did you mean 'VLLM_WORKER_MULTIPROC_METHOD'"),
    (GOOD.replace("kind: flag, name: --enforce-eager", "kind: env, name: PYTORCH_CUDA_ALOC_CONF"),
     "fixes.0.changes.0.name", "did you mean 'PYTORCH_CUDA_ALLOC_CONF'"),
    (GOOD.replace("kind: flag, name: --enforce-eager", "kind: env, name: MY-VAR"), "fixes.0.changes.0.name",
     "letters, digits and _"),
    (GOOD.replace("kind: flag, name: --enforce-eager", "kind: resources, name: limits.memroy"), "fixes.0.changes.0.name",
     "did you mean 'memory'"),
    (GOOD.replace("kind: flag, name: --enforce-eager", "kind: resources, name: limits.nvidia.com/gpus"),
     "fixes.0.changes.0.name", "did you mean 'nvidia.com/gpu'"),
    (GOOD.replace("kind: flag, name: --enforce-eager", "kind: resources, name: limit.memory"), "fixes.0.changes.0.name",
     "must look like limits.memory"),
    (GOOD.replace("kind: flag, name: --enforce-eager", "kind: probe, name: startupProbe.failureTreshold"),
     "fixes.0.changes.0.name", "did you mean 'failureThreshold'"),
    # formula parameters: known names, right types, none missing
    (GOOD.replace("value: enforce_eager_on}", "value: constant, params: {valeu: 'true', reason: x}}"),
     "fixes.0.changes.0.params", "has no parameter 'valeu' (did you mean 'value'?)"),
    (GOOD.replace("value: enforce_eager_on}", "value: constant, params: {value: true, reason: x}}"),
     "fixes.0.changes.0.params", 'must be text, not True (write it in quotes: "True")'),
    (GOOD.replace("value: enforce_eager_on}", "value: constant, params: {value: 'true'}}"),
     "fixes.0.changes.0.params", "needs parameter(s) reason"),
    (GOOD.replace("value: enforce_eager_on}", "value: enforce_eager_on, params: {value: 'true'}}"),
     "fixes.0.changes.0.params", "it takes none"),
    (GOOD.replace("value: enforce_eager_on}", "value: utilization_for_free_memory, params: {margin_gib: '0.5'}}")
         .replace("--enforce-eager", "--gpu-memory-utilization"),
     "fixes.0.changes.0.params", "'margin_gib' of formula 'utilization_for_free_memory' must be a number"),
    (GOOD.replace("kind: flag, name: --enforce-eager, value: enforce_eager_on}",
                  "kind: resources, name: limits.memory, value: constant, params: {value: lots, reason: x}}"),
     "fixes.0.changes.0.params", "'lots' is not a Kubernetes quantity"),
    # signals named in evidence and in the explanation must exist
    (GOOD + "evidence: [oom_tried_gib, gpu_blockz]\n", "evidence.1", "unknown signal 'gpu_blockz' (did you mean 'gpu_blocks'?)"),
    (GOOD.replace("explanation: it happened", "explanation: '[[ {gpu_total_gibb} GiB]]'"), "explanation",
     "unknown signal 'gpu_total_gibb' (did you mean 'gpu_total_gib'?)"),
    (GOOD.replace("explanation: it happened", "explanation: 'it {happened'"), "explanation", "literal brace"),
    (GOOD.replace("explanation: it happened", "explanation: 'it {0} happened'"), "explanation", "must be a signal name"),
    (GOOD.replace("title: A title", "title: 'A {stage} title'"), "title", "not filled in"),
])
def test_a_typo_names_the_file_and_the_field(tmp_path, broken, field, words):
    path = write(tmp_path, broken)
    with pytest.raises(PlaybookError) as err:
        load_file(path)
    message = str(err.value)
    assert str(path) in message
    assert f"`{field}" in message
    assert words in message


def test_id_must_match_file_name(tmp_path):
    with pytest.raises(PlaybookError, match="must match the file name"):
        load_file(write(tmp_path, GOOD, name="other.yaml"))


def test_broken_yaml_names_the_file(tmp_path):
    path = write(tmp_path, "id: [unclosed\n")
    with pytest.raises(PlaybookError, match="not valid YAML"):
        load_file(path)


def test_a_new_cause_needs_only_a_yaml_file(tmp_path):
    """Drop a playbook in a folder: its literal is scanned for, it matches, its change is computed."""
    from bot.diagnosis.diagnose import diagnose
    from bot.diagnosis.evidence import load_log

    folder = tmp_path / "books"
    shutil.copytree(DEFAULT_DIR, folder)
    (folder / "my-cause.yaml").write_text(GOOD.replace("priority: 100", "priority: 999"))
    log = tmp_path / "x.log"
    log.write_text("INFO 01-01 00:00:00 [x.py:1] start\nSomething specific happened here\n")
    result = diagnose(load_log(log), load_dir(folder))
    assert result.cause == "my-cause"
    assert [(c.name, c.after) for c in result.changes] == [("--enforce-eager", "true")]
    assert "Something specific happened here" in result.evidence


@pytest.mark.parametrize("regex, literal", [
    (r"max seq len \(\d+\) is larger than", ") is larger than"),
    (r"No available memory for the cache blocks", "No available memory for the cache blocks"),
    (r"Free memory on device(?: \S+)? \(", "Free memory on device"),
    (r"a|b", None),
    (r"colou?r scheme", "r scheme"),
])
def test_longest_literal(regex, literal):
    assert longest_literal(regex) == (literal.strip() if literal else None)


FORKED_CUDA = """\
id: cuda-forked-subprocess
title: vLLM's workers were forked after CUDA was initialised
summary: sets VLLM_WORKER_MULTIPROC_METHOD=spawn
priority: 960
when:
  - log: 'Cannot re-initialize CUDA in forked subprocess'
explanation: >-
  A worker process was forked after the parent had initialised CUDA[[ (tensor parallel size
  {tensor_parallel_size})]], and CUDA cannot be used in a forked child.
evidence: [fatal_error]
fixes:
  - changes:
      - kind: env
        name: VLLM_WORKER_MULTIPROC_METHOD
        value: constant
        params: {value: spawn, reason: "spawned workers start a fresh interpreter, so CUDA is initialised in each"}
"""

FORKED_CUDA_LOG = """\
INFO 10-13 09:06:20 [__init__.py:216] Automatically detected platform cuda.
(APIServer pid=1) INFO 10-13 09:06:22 [api_server.py:1839] vLLM API server version 0.11.0
(EngineCore_DP0 pid=79) INFO 10-13 09:06:25 [core.py:77] Initializing a V1 LLM engine (v0.11.0) with config: model='meta-llama/Llama-3.1-8B-Instruct'
(Worker_TP1 pid=112) ERROR 10-13 09:06:31 [multiproc_executor.py:597] WorkerProc failed to start.
(Worker_TP1 pid=112) ERROR 10-13 09:06:31 [multiproc_executor.py:597] Traceback (most recent call last):
(Worker_TP1 pid=112) ERROR 10-13 09:06:31 [multiproc_executor.py:597]   File "/usr/local/lib/python3.12/dist-packages/torch/cuda/__init__.py", line 358, in _lazy_init
(Worker_TP1 pid=112) ERROR 10-13 09:06:31 [multiproc_executor.py:597] RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use the 'spawn' start method
"""


def test_a_new_cause_with_a_constant_fix_needs_no_python(tmp_path):
    """The README's promise: one YAML file in an extra folder plus one bundle, and the bot knows the cause."""
    from bot.diagnosis.diagnose import diagnose
    from bot.diagnosis.evidence import load_bundle

    extra = tmp_path / "team-playbooks"
    extra.mkdir()
    (extra / "cuda-forked-subprocess.yaml").write_text(FORKED_CUDA)
    books = load_playbooks(extra_dirs=[extra])
    assert {b.id for b in books} == {b.id for b in load_dir()} | {"cuda-forked-subprocess"}

    pod = make_pod(command=["vllm", "serve"], args=["meta-llama/Llama-3.1-8B-Instruct", "--tensor-parallel-size", "2"],
                   gpus="2", env={"HF_HOME": "/models"})
    bundle = write_bundle(tmp_path / "bundle", FORKED_CUDA_LOG, pod)
    result = diagnose(load_bundle(bundle), books)
    assert result.cause == "cuda-forked-subprocess"
    assert [(c.kind, c.name, c.before, c.after) for c in result.changes] == [
        ("env", "VLLM_WORKER_MULTIPROC_METHOD", None, "spawn")]
    assert "(tensor parallel size 2)" in result.explanation
    assert ("Proposed: VLLM_WORKER_MULTIPROC_METHOD spawn. Spawned workers start a fresh interpreter, so CUDA is "
            "initialised in each.") in result.explanation
    assert any("Cannot re-initialize CUDA in forked subprocess" in line for line in result.evidence)
    # the bundled playbooks alone do not know this cause
    assert diagnose(load_bundle(bundle)).cause is None


def test_a_constant_already_in_place_is_not_proposed_again(tmp_path):
    from bot.diagnosis.diagnose import diagnose
    from bot.diagnosis.evidence import load_bundle

    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "cuda-forked-subprocess.yaml").write_text(FORKED_CUDA)
    pod = make_pod(command=["vllm", "serve"], args=["m"], env={"VLLM_WORKER_MULTIPROC_METHOD": "spawn"})
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", FORKED_CUDA_LOG, pod)), load_playbooks([extra]))
    assert result.cause == "cuda-forked-subprocess"
    assert result.changes == []
    assert result.confidence == "low"


def test_an_extra_folder_replaces_a_bundled_playbook_with_the_same_id(tmp_path, caplog):
    extra = tmp_path / "extra"
    extra.mkdir()
    doc = yaml.safe_load((DEFAULT_DIR / "shm-too-small.yaml").read_text())
    doc["title"] = "Our own words for a small /dev/shm"
    (extra / "shm-too-small.yaml").write_text(yaml.safe_dump(doc))
    with caplog.at_level(logging.INFO, logger="bot.diagnosis.playbooks"):
        books = load_playbooks([extra])
    assert len(books) == len(load_dir())
    assert next(b for b in books if b.id == "shm-too-small").title == "Our own words for a small /dev/shm"
    assert any("shm-too-small" in r.getMessage() and str(extra) in r.getMessage() and "replaces" in r.getMessage()
               for r in caplog.records)


def test_an_extra_folder_that_is_missing_or_empty_is_named(tmp_path):
    with pytest.raises(PlaybookError, match="no playbooks folder"):
        load_playbooks([tmp_path / "nope"])
    with pytest.raises(PlaybookError, match=r"no \*\.yaml playbooks"):
        load_playbooks([tmp_path])


def test_a_broken_playbook_in_an_extra_folder_names_its_file(tmp_path):
    (tmp_path / "cuda-forked-subprocess.yaml").write_text(FORKED_CUDA.replace("VLLM_WORKER_MULTIPROC_METHOD",
                                                                              "VLLM_WORKER_MULTIPROC"))
    with pytest.raises(PlaybookError) as err:
        load_playbooks([tmp_path])
    assert str(tmp_path / "cuda-forked-subprocess.yaml") in str(err.value)
    assert "field `fixes.0.changes.0.name`" in str(err.value)


def test_the_shipped_vllm_flag_list():
    flags = vllm_names().flags
    assert all(f.startswith("--") and f == f.lower() and "_" not in f for f in flags)
    # the flags this bot changes or reads as switches, across the versions it knows
    assert BOOLEAN_FLAGS <= set(flags)
    assert {c.name for b in load_dir() for f in b.fixes for c in f.changes
            if c.kind == "flag" and placeholder(c.name) is None} <= set(flags)
    # one source of truth: the per-release table read from the wheels (first and last release read)
    assert flags["--swap-space"] == {"since": "0.6.0", "until": "0.17.1"}  # removed in 0.18
    assert flags["--gpu-memory-utilization"] == {"since": "0.6.0"}  # in every release read
    for info in flags.values():
        assert set(info) <= {"since", "until"}
    assert "VLLM_WORKER_MULTIPROC_METHOD" in vllm_names().env
    assert "PYTORCH_CUDA_ALLOC_CONF" in vllm_names().pytorch_env
