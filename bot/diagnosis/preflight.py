"""The memory model before a crash: does a workload fit its GPUs, which stage fails first, what to change. Pure.

`plan(workload, node)` reads a Deployment / StatefulSet / Pod manifest (as a dict) and a node
(from `node.yaml`, or `gpu_node(product, count)` for a GPU product alone), and runs the same
memory model `diagnose` uses on a crash, with no log: the model's shape from the catalogue, the
GPUs the pod would be granted, the flags it would run with. The answer names the stage that
would fail first, the crash that stage shows (the playbook id `diagnose` would give it), and
the least disruptive change whose budget fits, or advice when no change to the pod does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from bot.diagnosis import cmdline, levers
from bot.diagnosis.budget import Fit
from bot.diagnosis.evidence import node_view, pod_view
from bot.diagnosis.gpus import product_spec
from bot.diagnosis.logfacts import LogFacts
from bot.diagnosis.models import Evidence, LogText, advice_text
from bot.diagnosis.signals import compute

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet")

# the stage that fails first -> the crash it shows (a playbook id)
CRASH_OF_STAGE = {
    "scheduling": "unschedulable",
    "startup": "tensor-parallel-mismatch",
    "nccl_init": "tensor-parallel-mismatch",
    "weights": "weights-exceed-gpu",
    "profiling": "profiling-activation-oom",
    "kv_sizing": "kv-cache-max-model-len",
    "kv_allocation": "kv-cache-max-model-len",
    "graph_capture": "cuda-graph-capture",
    "warmup": "sampler-warmup-max-num-seqs",
}
_IMAGE_VERSION = re.compile(r":v?(\d+\.\d+(?:\.\d+)?)")


class PlanError(ValueError):
    """A manifest or GPU the plan cannot read; the message is one line a person can act on."""


@dataclass
class PlanResult:
    workload: str
    container: str
    gpus: str
    model: str | None
    verdict: str  # fits | fails | unknown
    first_failure: str | None
    crash: str | None  # the playbook id of the crash the first failing stage shows
    why: str
    margin_gib: float | None
    change: str | None = None  # the least disruptive lever whose budget fits
    change_margin_gib: float | None = None
    advice: str = ""
    considered: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.verdict == "fits"

    def to_json(self) -> dict[str, Any]:
        return {"workload": self.workload, "container": self.container, "gpus": self.gpus, "model": self.model,
                "fits": self.fits, "verdict": self.verdict, "first_failure": self.first_failure,
                "predicted_crash": self.crash, "why": self.why, "margin_gib": self.margin_gib,
                "change": self.change, "change_margin_gib": self.change_margin_gib, "advice": self.advice,
                "considered": self.considered}


def gpu_node(product: str, count: int) -> dict[str, Any]:
    """A node as GPU feature discovery labels it, from a product name alone ('NVIDIA-H100-80GB-HBM3', 'L40S')."""
    name = product if product.upper().startswith("NVIDIA") else f"NVIDIA-{product}"
    memory, _cc = product_spec(name)
    if memory is None:
        raise PlanError(f"GPU product {product!r}: its memory is not known here; give --node NODE.yaml "
                        "(kubectl get node NAME -o yaml) instead")
    labels = {"nvidia.com/gpu.product": name, "nvidia.com/gpu.memory": str(memory), "nvidia.com/gpu.count": str(count)}
    return {"kind": "Node", "metadata": {"name": "planned-node", "labels": labels},
            "status": {"capacity": {"nvidia.com/gpu": str(count)}, "allocatable": {"nvidia.com/gpu": str(count)}}}


def pod_of(workload: dict[str, Any]) -> dict[str, Any]:
    """The pod a workload would create (its template), or the Pod itself."""
    if not isinstance(workload, dict):
        raise PlanError("the manifest is not a Kubernetes object (a YAML mapping with kind and spec)")
    kind = workload.get("kind")
    if kind == "Pod":
        return workload
    if kind in WORKLOAD_KINDS:
        template = ((workload.get("spec") or {}).get("template")) or {}
        if not isinstance(template.get("spec"), dict):
            raise PlanError(f"the {kind} has no spec.template.spec")
        meta = {**(template.get("metadata") or {}), "name": (workload.get("metadata") or {}).get("name"),
                "namespace": (workload.get("metadata") or {}).get("namespace")}
        return {"kind": "Pod", "metadata": meta, "spec": template["spec"]}
    raise PlanError(f"kind {kind!r}: give a Deployment, StatefulSet or Pod manifest")


def _vllm_container(pod: dict[str, Any]) -> dict[str, Any]:
    containers = [c for c in (pod.get("spec") or {}).get("containers") or [] if isinstance(c, dict)]
    if not containers:
        raise PlanError("the pod template has no containers")
    def runs_vllm(c: dict[str, Any]) -> bool:
        words = [str(w) for w in (c.get("command") or []) + (c.get("args") or [])] + [str(c.get("image", ""))]
        return any("vllm" in w for w in words)
    return next((c for c in containers if runs_vllm(c)), containers[0])


def plan(workload: dict[str, Any], node: dict[str, Any] | None) -> PlanResult:
    pod = pod_of(workload)
    container = _vllm_container(pod)
    parsed = cmdline.parse(container.get("command"), container.get("args"))
    evidence = Evidence(log=LogText(text=""), pod=pod, node=node, container=container.get("name"))
    facts = LogFacts()
    signals = compute(facts, pod_view(evidence), node_view(evidence), parsed)
    version = _IMAGE_VERSION.search(str(container.get("image", "")))
    if version:
        signals.set("vllm_version", version.group(1))
    model = levers.build(facts, signals, parsed, pod, node, container.get("name"))
    fit = model.baseline()
    autofit = str(parsed.get("--max-model-len") or "").lower() in {"auto", "-1"}
    if autofit and fit.first_failure == "kv_sizing" and fit.max_len_that_fits:
        fit = model.fit(max_model_len=fit.max_len_that_fits)  # vLLM 0.14+ shortens the context itself
    meta = pod.get("metadata") or {}
    result = PlanResult(
        workload=f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}", container=str(container.get("name")),
        gpus=model.grant.describe(), model=parsed.model, verdict=fit.verdict, first_failure=fit.first_failure,
        crash=_crash(model, fit),
        why=levers.why_not(fit) if not fit.fits else "fits", margin_gib=fit.margin_gib)
    if fit.verdict == "fails":
        _search(model, fit, result)
    return result


def _crash(model: levers.MemoryModel, fit: Fit) -> str | None:
    """The crash the first failing stage shows, as `diagnose` would name it."""
    if fit.verdict != "fails":
        return None
    stage = fit.first_failure or ""
    weights = model.weights_gib(fit)
    capacity = model.budget.capacity.value if model.budget.capacity is not None else None
    if stage in {"profiling", "kv_sizing"} and weights and capacity and weights[0] > capacity - 1.5:
        return "weights-exceed-gpu"  # CUDA context and loader buffers leave the weights no room
    if stage == "kv_sizing" and fit.kv_available_gib is not None and fit.kv_available_gib <= 0:
        return "no-kv-cache-memory"
    return CRASH_OF_STAGE.get(stage)


def _search(model: levers.MemoryModel, fit: Fit, result: PlanResult) -> None:
    """The least disruptive lever for the stage that fails first (the playbooks' order)."""
    ran, grant = model.ran, model.grant
    node_gpus = grant.on_node
    world = ran.tensor_parallel_size * ran.pipeline_parallel_size
    found: levers.Considered | None = None
    stage = "weights" if result.crash == "weights-exceed-gpu" else fit.first_failure  # the crash it will show
    if stage in {"startup", "scheduling", "nccl_init"}:
        if node_gpus and world <= node_gpus and grant.can_tensor_parallel:
            found = levers.try_lever(model, f"limits.{grant.resource or 'nvidia.com/gpu'} {world}", gpu_count=world)
        if found is None and ran.gpu_count:
            found = levers.try_lever(model, f"--tensor-parallel-size {ran.gpu_count // ran.pipeline_parallel_size or 1}",
                                     shorten=True, tensor_parallel_size=max(1, ran.gpu_count // ran.pipeline_parallel_size))
    elif stage == "weights":
        if node_gpus and grant.can_tensor_parallel:
            found, _ = levers.tp_search(model, node_gpus, ran.tensor_parallel_size * 2)
        if found is None and model.fp8() in {"native", "weight-only"}:
            found = levers.try_lever(model, "--quantization fp8", quantization="fp8", shorten=True)
    elif stage in {"kv_sizing", "kv_allocation", "profiling"}:
        found = _shorter_context(model)
    if found is not None:
        result.change, result.change_margin_gib = found.lever, found.fit.margin_gib
    elif stage == "weights" or any(c.fit.first_failure == "weights" for c in model.considered):
        result.advice = advice_text(levers.advice_for_weights(model, node_gpus))
    result.considered = [f"{c.lever}: {c.why_not}" for c in model.considered if not c.chosen]


def _shorter_context(model: levers.MemoryModel) -> levers.Considered | None:
    """The longest power-of-two --max-model-len below the current one (down to 2048) whose budget
    fits; at each length the current --gpu-memory-utilization first, then lower ones together with
    it: a shorter context needs less KV cache, so a lower utilization can give back the headroom
    the start-up stage lacks (one lever at a time misses that pair)."""
    current = model.budget.max_model_len(model.ran)  # the flag, else the model's own context
    length = 1 << (int(current.value if current is not None else 4096) - 1).bit_length() - 1
    while length >= 2048:
        found = levers.try_lever(model, f"--max-model-len {length}", max_model_len=length)
        for util in _lower_utilizations(model.ran.gpu_memory_utilization):
            if found is not None:
                break
            found = levers.try_lever(model, f"--max-model-len {length} with --gpu-memory-utilization {util:.2f}",
                                     max_model_len=length, gpu_memory_utilization=util)
        if found is not None:
            return found
        length //= 2
    return None


def _lower_utilizations(current: float | None) -> list[float]:
    """0.05 steps below the current utilization (vLLM's default 0.9), down to 0.80."""
    start = current if current is not None else 0.9
    steps = int(round((start - 0.80) / 0.05))
    return [round(start - 0.05 * i, 2) for i in range(1, steps + 1)]


def render(result: PlanResult) -> str:
    lines = [f"vLLM plan: {result.workload} container {result.container}",
             f"  GPUs: {result.gpus}", f"  model: {result.model or 'unknown'}"]
    if result.verdict == "fits":
        margin = f" with {result.margin_gib:.2f} GiB to spare" if result.margin_gib is not None else ""
        lines.append(f"Fits{margin} at the tightest stage.")
    elif result.verdict == "unknown":
        lines.append(f"Cannot judge: {result.why}")
    else:
        lines.append(f"Does not fit: {result.why}.")
        if result.crash:
            lines.append(f"It would crash as: {result.crash}")
        if result.change:
            spare = f" (fits with {result.change_margin_gib:.2f} GiB to spare)" if result.change_margin_gib is not None else ""
            lines.append(f"Change: {result.change}{spare}")
        elif result.advice:
            lines.append(result.advice)
        else:
            lines.append("No change to this pod fits.")
        lines += [f"  not chosen: {c}" for c in result.considered]
    return "\n".join(lines)
