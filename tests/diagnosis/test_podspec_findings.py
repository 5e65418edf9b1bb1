"""Pod-spec checks that run whatever the log says (issue 21): TP x PP against the pod's and the
node's devices (a LeaderWorkerSet group counts its pods' devices), /dev/shm with several ranks,
a probe window shorter than the observed load; a typed second finding beside another cause."""

from __future__ import annotations

import json

from builders import make_node, make_pod

from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.models import DiagnosisResult, Evidence, FindingKind, LogText
from bot.diagnosis.render import render_text

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
NCCL_DUPLICATE = """INFO 11-30 05:00:00 [__init__.py:239] Automatically detected platform cuda.
INFO 11-30 05:00:01 [core.py:58] Initializing a V1 LLM engine (v0.9.1) with config: model='meta-llama/Llama-3.1-8B-Instruct', tensor_parallel_size=4
(VllmWorker rank=2 pid=311) ERROR 11-30 05:00:09 [multiproc_executor.py:527] torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.21.5
(VllmWorker rank=2 pid=311) ERROR 11-30 05:00:09 [multiproc_executor.py:527] ncclInvalidUsage: This usually reflects invalid usage of NCCL library.
(VllmWorker rank=2 pid=311) ERROR 11-30 05:00:09 [multiproc_executor.py:527] Last error:
(VllmWorker rank=2 pid=311) ERROR 11-30 05:00:09 [multiproc_executor.py:527] Duplicate GPU detected : rank 2 and rank 0 both on CUDA device 1000
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""
KV_SHORT = """INFO 11-30 05:00:01 [core.py:58] Initializing a V1 LLM engine (v0.9.1) with config: model='meta-llama/Llama-3.1-8B-Instruct', tensor_parallel_size=2
INFO 11-30 05:01:10 [gpu_model_runner.py:1595] Model loading took 7.51 GiB and 410.2 seconds
ERROR 11-30 05:01:20 [core.py:515] ValueError: To serve at least one request with the models's max seq len (131072), (8.00 GiB KV cache is needed, which is larger than the available KV cache memory (5.10 GiB). Based on the available memory, the estimated maximum model length is 83520. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.
"""
SHM = [{"name": "dshm", "mountPath": "/dev/shm"}]


def volumes(size: str | None) -> list[dict]:
    empty = {"medium": "Memory", **({"sizeLimit": size} if size else {})}
    return [{"name": "dshm", "emptyDir": empty}]


def run(log: str, args: list[str], gpus: str = "2", node_gpus: int = 2, annotations=None, **pod_kw) -> DiagnosisResult:
    pod = make_pod(command=["vllm", "serve"], args=args, gpus=gpus, **pod_kw)
    if annotations:
        pod["metadata"]["annotations"] = annotations
    node = make_node("NVIDIA-A100-SXM4-80GB", memory_mib=81920, count=node_gpus)
    return diagnose(Evidence(log=LogText(text=log), pod=pod, node=node))


def kinds(result: DiagnosisResult) -> set[FindingKind]:
    return {f.kind for f in result.findings}


def test_duplicate_gpu_with_tp_above_the_pod_is_the_tp_cause():
    result = run(NCCL_DUPLICATE, [MODEL, "--tensor-parallel-size", "4"], gpus="2", node_gpus=8,
                 volumes=volumes("8Gi"), mounts=SHM)
    assert result.cause == "tensor-parallel-mismatch"
    assert any(c.name == "--tensor-parallel-size" and c.after == "2" for c in result.changes)
    assert FindingKind.PARALLEL_ABOVE_POD_DEVICES not in kinds(result)  # it is the cause, not a second finding


def test_tp_above_the_pod_is_a_second_finding_beside_another_cause():
    result = run(KV_SHORT, [MODEL, "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2"], gpus="2",
                 node_gpus=2, volumes=volumes("8Gi"), mounts=SHM)
    assert result.cause == "kv-cache-max-model-len"
    found = {f.kind: f for f in result.findings}
    pod = found[FindingKind.PARALLEL_ABOVE_POD_DEVICES]
    assert "= 4 ranks, one device each, but the pod has 2 device(s)" in pod.text
    assert FindingKind.PARALLEL_ABOVE_NODE_DEVICES in found  # 4 ranks, the node has 2
    assert "node gpu-node-1 has 2" in found[FindingKind.PARALLEL_ABOVE_NODE_DEVICES].text
    public = result.to_public_json()["findings"]
    assert {f["kind"] for f in public} >= {"parallel-above-pod-devices", "parallel-above-node-devices"}
    assert "Also: More parallel ranks than the pod's devices" in render_text(result)


def test_a_leaderworkerset_group_counts_its_devices():
    lws = {"leaderworkerset.sigs.k8s.io/size": "2"}
    result = run(KV_SHORT, [MODEL, "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2"], gpus="2",
                 node_gpus=2, annotations=lws, volumes=volumes("8Gi"), mounts=SHM)
    assert not kinds(result) & {FindingKind.PARALLEL_ABOVE_POD_DEVICES, FindingKind.PARALLEL_ABOVE_NODE_DEVICES}
    lws = {"leaderworkerset.sigs.k8s.io/size": "1"}
    result = run(KV_SHORT, [MODEL, "--tensor-parallel-size", "4"], gpus="2", node_gpus=2, annotations=lws,
                 volumes=volumes("8Gi"), mounts=SHM)
    assert FindingKind.PARALLEL_ABOVE_POD_DEVICES in kinds(result)


def test_no_shm_with_tp_2_is_named_beside_a_kv_cause():
    result = run(KV_SHORT, [MODEL, "--tensor-parallel-size", "2"])
    assert result.cause == "kv-cache-max-model-len"
    shm = next(f for f in result.findings if f.kind == FindingKind.SHM_MISSING)
    assert "2 vLLM processes exchange tensors through /dev/shm" in shm.text
    assert [(c.kind, c.name) for c in shm.changes] == [("volume", "/dev/shm")]
    assert not any(c.kind == "volume" for c in result.changes)  # not smuggled into the primary change


def test_shm_too_small_and_big_enough():
    small = run(KV_SHORT, [MODEL, "--tensor-parallel-size", "2"], volumes=volumes("64Mi"), mounts=SHM)
    f = next(f for f in small.findings if f.kind == FindingKind.SHM_TOO_SMALL)
    assert [(c.before, c.after) for c in f.changes] == [("64Mi", "2Gi")]
    big = run(KV_SHORT, [MODEL, "--tensor-parallel-size", "2"], volumes=volumes("8Gi"), mounts=SHM)
    assert not kinds(big) & {FindingKind.SHM_TOO_SMALL, FindingKind.SHM_MISSING}
    single = run(KV_SHORT.replace("tensor_parallel_size=2", "tensor_parallel_size=1"), [MODEL], gpus="1")
    assert not kinds(single) & {FindingKind.SHM_TOO_SMALL, FindingKind.SHM_MISSING}  # one rank needs none


def test_probe_window_below_the_logged_load_time():
    liveness = {"httpGet": {"path": "/health", "port": 8000}, "initialDelaySeconds": 60, "periodSeconds": 10,
                "failureThreshold": 3}
    result = run(KV_SHORT, [MODEL, "--tensor-parallel-size", "2"], volumes=volumes("8Gi"), mounts=SHM,
                 liveness=liveness)
    probe = next(f for f in result.findings if f.kind == FindingKind.PROBE_BUDGET_SHORT)
    assert "allows 90 s before it kills the container, but start-up took 410 s" in probe.text
    change = probe.changes[0]
    assert change.name == "startupProbe"
    assert json.loads(change.after or "")["failureThreshold"] * 10 == 840  # 2 x 410 s, rounded up to minutes
    roomy = dict(liveness, initialDelaySeconds=900)
    result = run(KV_SHORT, [MODEL, "--tensor-parallel-size", "2"], volumes=volumes("8Gi"), mounts=SHM,
                 liveness=roomy)
    assert FindingKind.PROBE_BUDGET_SHORT not in kinds(result)


READY_THEN_DEAD = """INFO 11-30 05:00:01 [core.py:58] Initializing a V1 LLM engine (v0.10.1) with config: model='meta-llama/Llama-3.1-8B-Instruct', tensor_parallel_size=1
INFO:     Application startup complete.
ERROR 11-30 07:10:00 [async_llm.py:420] AsyncLLM output_handler failed.
vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
"""


def test_engine_dead_after_ready_without_an_oom_is_no_memory_cause():
    """A server that died on a request with no memory figure: an incident with no known cause and no
    change, never the run-time OOM playbook's utilization cut."""
    result = run(READY_THEN_DEAD, [MODEL], gpus="1", node_gpus=1)
    assert result.cause is None and result.changes == []
    oom = READY_THEN_DEAD.replace(
        "vllm.v1.engine", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        "capacity of 79.19 GiB of which 1.10 GiB is free. Including non-PyTorch memory, this process has 78.07 GiB "
        "memory in use. Of the allocated memory 77.50 GiB is allocated by PyTorch, and 100.00 MiB is reserved by "
        "PyTorch but unallocated.\nvllm.v1.engine", 1)
    result = run(oom, [MODEL, "--gpu-memory-utilization", "0.95"], gpus="1", node_gpus=1)
    assert result.cause == "runtime-oom-after-ready"
    assert [(c.name, c.before) for c in result.changes][:1] == [("--gpu-memory-utilization", "0.95")]
