"""Every proposal gets the budget before and after, and the answer to the obvious alternative,
from the same budget (issue 18): one test per kind of proposal, on the fixture bundles as
`diagnose` reads them, plus the budget's own arithmetic where a bundle would be contrived."""

from __future__ import annotations

import re

from builders import FIXTURE_BUNDLES

from bot.diagnosis.budget import BudgetInputs, Config, KvSource, LogFigures, build_budget
from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evidence import load_bundle
from bot.diagnosis.gpus import GpuGrant
from bot.diagnosis.impact import after_config, alternative
from bot.diagnosis.levers import MemoryModel
from bot.diagnosis.models import Change


def diagnosed(name: str):
    return diagnose(load_bundle(FIXTURE_BUNDLES / name))


def table(picture: str) -> dict[str, list[str]]:
    """The budget table's rows: name -> [as it ran, with the change]."""
    rows = {}
    for line in picture.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] in ("weights per GPU", "KV cache", "tokens that fit", "verdict"):
            rows[cells[0]] = cells[1:]
    return rows


def tokens(cell: str) -> int:
    return int(cell.split()[0].replace(",", ""))


def test_a_kv_cache_proposal_gets_before_and_after_and_the_utilization_answer():
    d = diagnosed("kv-v1-0.10-estimate")
    assert [c.after for c in d.changes] == ["28672"]
    rows = table(d.memory_picture)
    assert "with the change" in d.memory_picture
    # as it ran: vLLM's own figures, said to be measured; with the change: the same pool, now enough
    assert rows["tokens that fit"][0] == "29,648 (log)" and rows["KV cache"][0] == "3.62 GiB (log)"
    assert tokens(rows["tokens that fit"][1]) >= 28672 and rows["verdict"][1].startswith("fits")
    assert rows["verdict"][0].startswith("fails at kv sizing")
    assert d.alternative.startswith("raising --gpu-memory-utilization alone is not enough: at 0.95")
    assert "fewer than the 131,072 of --max-model-len" in d.alternative


def test_the_log_wins_over_the_estimate_for_the_kv_cache_as_it_ran():
    """The V0 log gives 1884 blocks of 16 tokens: the table used to say 0.36 GiB and 2,944 tokens."""
    d = diagnosed("kv-v0-0.6-api-server")
    rows = table(d.memory_picture)
    assert rows["tokens that fit"][0] == "30,144 (log)"
    assert "K KV cache" in d.memory_picture and rows["KV cache"][0].endswith("(log)")
    assert "holds only 30,144 tokens" in d.explanation
    blocks_only = table(diagnosed("kv-v0-0.4-blocks-only").memory_picture)
    assert blocks_only["tokens that fit"][0] == "14,288 (log)"  # 893 blocks x 16
    assert blocks_only["verdict"][0].startswith("fails at kv sizing"), "14,288 tokens cannot hold 16,384"


def test_a_no_kv_cache_utilization_proposal_gets_before_and_after_and_the_context_answer():
    d = diagnosed("nokv-v1-0.11-tp2")
    assert [(c.name, c.after) for c in d.changes] == [("--gpu-memory-utilization", "0.90")]
    rows = table(d.memory_picture)
    before_kv = rows["KV cache"][0].split()[0]
    assert float(before_kv) < 0 and rows["tokens that fit"][0].startswith("0 ")
    assert tokens(rows["tokens that fit"][1]) >= 32768 and rows["verdict"][1].startswith("fits")
    assert d.alternative == ("lowering --max-model-len alone is not enough: at 0.7 nothing is left for the KV cache "
                             f"({before_kv} GiB after the weights and the profiling peak), whatever the length.")


def test_a_weights_proposal_answers_utilization_with_the_tables_weights():
    d = diagnosed("weights-70b-tp1-node8-shm")
    rows = table(d.memory_picture)
    weights = rows["weights per GPU"][0]
    assert f"the weights alone ({weights} per GPU) need more than the GPU's" in d.alternative
    assert d.alternative.startswith("raising --gpu-memory-utilization cannot help")


def test_an_eager_mode_proposal_gets_the_after_column_too():
    d = diagnosed("mrv2-capture-0.33-l4")
    assert [c.name for c in d.changes] == ["--enforce-eager"]
    assert "with the change" in d.memory_picture and "What fits (--enforce-eager true)" in d.memory_picture


def test_raising_utilization_cannot_help_when_another_process_holds_the_gpu():
    """The issue's example: the ceiling comes from what other processes hold, from the same budget."""
    ran = Config(gpu_memory_utilization=0.9, max_model_len=131072)
    log = LogFigures(total_gpu_gib=22.49, weights_gib=14.99, available_kv_gib=3.62, kv_tokens=29648,
                     gpu_memory_utilization=0.9, other_processes_gib=3.0, vllm_version="0.10.1", engine="v1")
    budget = build_budget(BudgetInputs(log=log, ran=ran))
    model = MemoryModel(grant=GpuGrant(), spec=None, ran=ran, budget=budget)
    assert model.baseline().kv_source == KvSource.LOG and model.baseline().max_len_that_fits == 29648
    said = alternative(model, [Change(kind="flag", name="--max-model-len", before="131072", after="28672")])
    assert said == ("raising --gpu-memory-utilization cannot help: 3.00 GiB of this GPU is held by another process, "
                    "so 0.86 is the most vLLM can ask for and it runs at 0.9.")


def test_after_config_reads_the_flags_the_budget_sizes_from():
    ran = Config(gpu_memory_utilization=0.7, max_model_len=32768)
    changes = [Change(kind="flag", name="--max-model-len", before="32768", after="16384"),
               Change(kind="flag", name="--enforce-eager", after="true"),
               Change(kind="resources", name="limits.nvidia.com/gpu", before="1", after="2"),
               Change(kind="env", name="PYTORCH_CUDA_ALLOC_CONF", after="expandable_segments:True")]
    after = after_config(ran, changes)
    assert after == Config(gpu_memory_utilization=0.7, max_model_len=16384, enforce_eager=True, gpu_count=2)
    assert after_config(ran, changes[3:]) is None  # nothing the budget reads: no 'with the change' column


def test_a_pinned_kv_pool_answers_utilization_with_the_pin():
    d = diagnosed("kv-pinned-pool-0.19")
    rows = table(d.memory_picture)
    assert rows["KV cache"][0].startswith("4.00 GiB") and "with the change" in d.memory_picture
    assert d.alternative == ("raising --gpu-memory-utilization cannot help: --kv-cache-memory-bytes pins the KV cache "
                             "at 4.00 GiB, whatever the utilization.")
