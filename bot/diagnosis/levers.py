"""The memory model of one diagnosis, built once: the GPUs granted, the model's shape, the budget. Pure.

`build(...)` turns the evidence (log facts, signals, command line, pod and node) into a
`MemoryModel`: a `gpus.GpuGrant`, a `catalogue.ModelSpec` and a `budget.Budget` with the
configuration that ran. Formulas ask it `fit(**update)` for a candidate (a lever: TP with the
GPU limit it needs, fp8 weights, a shorter context, CPU offload) and record what they
considered (`consider`), so the message can show the chosen lever's before/after and why the
others were not chosen. `software_problem` is the physical sanity check that runs before any
proposal: an OOM whose numbers no memory setting can explain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from bot.diagnosis import accelerators
from bot.diagnosis.budget import BudgetInputs, Config, Fit, LogFigures, build_budget
from bot.diagnosis.catalogue import ModelSpec, resolve_model
from bot.diagnosis.cmdline import ParsedCommand
from bot.diagnosis.gpus import GpuGrant, fp8_weights, gpu_grant
from bot.diagnosis.logfacts import LogFacts
from bot.diagnosis.models import Advice, AdviceKind, Change, revised
from bot.diagnosis.signals import Signals

MARGIN_GIB = 0.5  # a lever is proposed only when every stage keeps at least this much free
SOFTWARE = "this looks like a software problem, not a memory setting"


@dataclass
class Considered:
    lever: str
    fit: Fit
    chosen: bool = False
    why_not: str = ""


@dataclass
class MemoryModel:
    grant: GpuGrant
    spec: ModelSpec | None
    ran: Config
    budget: Any  # budget.Budget (Any: pydantic model, kept out of the dataclass repr)
    considered: list[Considered] = field(default_factory=list)

    def fit(self, **update: Any) -> Fit:
        return self.budget.fits(revised(self.ran, **update))

    def baseline(self) -> Fit:
        return self.budget.fits(self.ran)

    def consider(self, lever: str, fit: Fit, chosen: bool, why_not: str = "") -> None:
        self.considered.append(Considered(lever, fit, chosen, why_not))

    @property
    def chosen(self) -> Considered | None:
        return next((c for c in reversed(self.considered) if c.chosen), None)

    def weights_gib(self, fit: Fit | None = None) -> tuple[float, str] | None:
        """One weights figure per GPU and its source (the same number everywhere in the message)."""
        figure = (fit or self.baseline()).figures.get("weights")
        if figure is None:
            return None
        return figure.value, figure.source + (f": {figure.detail}" if figure.detail else "")

    def fp8(self) -> str:
        """'native' | 'weight-only' | 'none' | 'unknown' for --quantization fp8 here."""
        if self.spec is not None and self.spec.quantization is not None:
            return "none"  # already quantized
        support = fp8_weights(self.grant.compute_capability, bool(self.spec and self.spec.moe))
        version = self.budget.inputs.log.vllm_version
        if support == "weight-only" and self.grant.compute_capability == (7, 5) and not _at_least(version, (0, 11)):
            return "none"
        return support


def _at_least(version: str | None, want: tuple[int, int]) -> bool:
    parts = (version or "").split(".")
    try:
        return (int(parts[0]), int(parts[1])) >= want
    except (ValueError, IndexError):
        return False


def _float(value: Any) -> float | None:
    try:
        return float(str(value))
    except (TypeError, ValueError):
        return None


def _int(value: Any) -> int | None:
    number = _float(value)
    return int(number) if number is not None else None


_HUMAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)\s*$")
_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_bytes(value: Any) -> int | None:
    """vLLM's human-readable ints (0.8.4+): k/m/g are powers of 10, K/M/G powers of 2 ('4G' = 4 x 2**30)."""
    m = _HUMAN.match(str(value)) if value is not None else None
    if m is None:
        return None
    if m.group(2).isupper() and "." in m.group(1):
        return None  # vLLM accepts only integers with the binary suffixes
    return int(float(m.group(1)) * _SCALE[m.group(2)])


def kv_pool_pinned(model: MemoryModel | None, s: Signals) -> bool:
    """--kv-cache-memory-bytes sizes the KV cache: --gpu-memory-utilization then changes nothing in it."""
    return bool(s.get("kv_pool_pinned") or (model is not None and model.ran.kv_cache_memory_bytes))


def ran_config(s: Signals, cmd: ParsedCommand) -> Config:
    """The configuration that ran: the manifest's flags, else the log's engine config, else defaults."""
    def pick(flag: str, key: str) -> Any:
        raw = cmd.get(flag)
        return raw if raw is not None else s.get(key)

    eager = str(pick("--enforce-eager", "config_enforce_eager") or "false").lower() == "true"
    update: dict[str, Any] = {
        "tensor_parallel_size": max(1, s.get("tensor_parallel_size") or 1),
        "pipeline_parallel_size": max(1, s.get("pipeline_parallel_size") or 1),
        "gpu_count": s.get("pod_gpus"),
        "gpu_memory_utilization": _float(pick("--gpu-memory-utilization", "config_gpu_memory_utilization")),
        "max_model_len": s.get("max_model_len"),
        "max_num_seqs": _int(pick("--max-num-seqs", "config_max_num_seqs")),
        "max_num_batched_tokens": _int(pick("--max-num-batched-tokens", "config_max_num_batched_tokens")),
        "kv_cache_dtype": str(pick("--kv-cache-dtype", "config_kv_cache_dtype") or "auto"),
        "quantization": pick("--quantization", "config_quantization"),
        "dtype": pick("--dtype", "config_dtype"),
        "cpu_offload_gb": _float(cmd.get("--cpu-offload-gb")) or 0.0,
        "kv_cache_memory_bytes": human_bytes(pick("--kv-cache-memory-bytes", "config_kv_cache_memory_bytes")),
        "enforce_eager": eager,
    }
    if update["quantization"] in {None, "None", "none"}:
        update["quantization"] = None
    if update["dtype"] is not None:
        update["dtype"] = str(update["dtype"]).replace("torch.", "")
    return Config(**{k: v for k, v in update.items() if v is not None})


def log_figures(s: Signals) -> LogFigures:
    names = [n for n in LogFigures.model_fields if n not in {"engine", "vllm_version"}]
    values = {n: s.get(n) for n in names if isinstance(s.get(n), (int, float)) and not isinstance(s.get(n), bool)}
    return LogFigures(vllm_version=s.get("vllm_version"), engine=s.get("engine"), **values)


def build(facts: LogFacts, s: Signals, cmd: ParsedCommand, raw_pod: dict[str, Any] | None,
          raw_node: dict[str, Any] | None, container: str | None,
          bundle_config: dict[str, Any] | None = None) -> MemoryModel:
    total = s.get("gpu_total_gib") if (facts.get("total_gpu_gib") or facts.get("oom_total_gib")) else None
    grant = gpu_grant(raw_pod, raw_node, container, log_total_gib=total)
    spec = resolve_model(cmd.model or s.get("config_model"), bundle_config)
    ran = ran_config(s, cmd)
    budget = build_budget(BudgetInputs(log=log_figures(s), ran=ran, model=spec, gpus=grant))
    return MemoryModel(grant=grant, spec=spec, ran=ran, budget=budget)


# ---- physical sanity -------------------------------------------------------------------------


def software_problem(model: MemoryModel | None, s: Signals) -> str | None:
    """An OOM no memory setting explains: one allocation larger than the card, an OOM loading a
    model that fits with room to spare, or a whole-card request with nothing loaded yet."""
    if model is None or not s.get("oom_any"):
        return None
    capacity = model.budget.capacity.value if model.budget.capacity is not None else s.get("gpu_total_gib")
    tried, free = s.get("oom_tried_gib"), s.get("oom_free_gib")
    if not capacity or tried is None:
        return None
    if tried > capacity * 1.02:
        return (f"One allocation of {tried:.2f} GiB is larger than the whole {capacity:.2f} GiB GPU: no memory "
                f"setting can satisfy it. A kernel or package missing from the image (a fallback path "
                f"allocating the whole problem at once) does this; {SOFTWARE}.")
    stage = s.get("stage")
    allocated = s.get("oom_allocated_gib")
    if free is not None and free < 0.01 and tried >= 0.9 * capacity and stage in {None, "startup", "nccl_init"} \
            and not allocated and not s.get("weights_gib"):
        return (f"PyTorch asked for {tried:.2f} GiB of a {capacity:.2f} GiB GPU with 0 bytes free before any weights "
                f"were loaded: a request the size of the card at start-up is a PyTorch or driver regression "
                f"(or a broken device), not a budget; {SOFTWARE}.")
    if stage == "weights" and (s.get("other_processes_gib") or 0) < 2.0 and model.spec is not None:
        weights = model.weights_gib()
        if weights is not None and weights[0] < 0.5 * capacity and allocated is not None and allocated < 0.5 * weights[0]:
            return (f"The GPU ran out of memory while loading the first shards: {allocated:.2f} GiB held, asking "
                    f"{tried:.2f} GiB more, yet the weights are about {weights[0]:.2f} GiB per GPU ({weights[1]}) on "
                    f"a {capacity:.2f} GiB GPU, which fits with {capacity - weights[0]:.2f} GiB to spare. A version "
                    f"regression in weight loading does this; {SOFTWARE}.")
    return None


# ---- the lever search ---------------------------------------------------------------------------

MEMORY_STAGES = {"startup", "weights", "profiling", "kv_sizing", "kv_allocation", "graph_capture", "warmup"}


def why_not(fit: Fit) -> str:
    """'fails at weights: needs 65.63 GiB, has 44.86 GiB' (the first stage that fails)."""
    if fit.verdict == "unknown":
        return "not judged: " + "; ".join(a for a in fit.assumptions if a.startswith("no "))
    if fit.fits:
        return f"fits, but with only {fit.margin_gib:.2f} GiB to spare" if fit.margin_gib is not None else "fits"
    check = next((c for c in fit.checks if not c.ok), None)
    if check is None:
        return f"fails at {fit.first_failure}"
    numbers = (f": needs {check.need_gib:.2f} GiB, has {check.have_gib:.2f} GiB"
               if check.need_gib is not None and check.have_gib is not None else f": {check.detail}")
    return f"fails at {check.stage.replace('_', ' ')}{numbers}"


def fails_on_memory(fit: Fit) -> bool:
    return fit.verdict == "fails" and fit.first_failure in MEMORY_STAGES


def margin_text(fit: Fit) -> str:
    if fit.margin_gib is None:
        return ""
    return f" The budget check: it fits with {fit.margin_gib:.2f} GiB to spare at the tightest stage."


def try_lever(model: MemoryModel, lever: str, margin: float = MARGIN_GIB, shorten: bool = False,
              **update: Any) -> Considered | None:
    """Fit one candidate; with `shorten`, a KV shortfall is met by --max-model-len down to what fits.
    The search is here once for `diagnose` (the playbooks' formulas) and `plan` alike."""
    fit = model.fit(**update)
    tried: int | None = None
    while shorten and not fit.fits and fit.first_failure == "kv_sizing":
        # the profiling run's activations grow with the context, so the KV room measured at one length
        # can be less than a shorter length leaves: measure again at each length until one fits
        length = _length_for_kv(fit, margin)
        if length is None or length < 2048 or length >= (fit.config.max_model_len or length + 1):
            break
        tried = length
        fit = model.fit(**update, max_model_len=length)
    if tried is not None:
        lever += f" with --max-model-len {tried}"
    ok = fit.fits_with(margin)
    model.consider(lever, fit, ok, "" if ok else why_not(fit))
    return model.considered[-1] if ok else None


def _length_for_kv(fit: Fit, margin: float) -> int | None:
    """The --max-model-len the KV room of this fit holds with the margin kept free (1024s above 8192)."""
    per_token = fit.figures.get("kv_bytes_per_token")
    if not fit.max_len_that_fits or per_token is None or fit.kv_available_gib is None:
        return None
    tokens = int((fit.kv_available_gib - margin) * 2**30 / per_token.value)
    return tokens // 1024 * 1024 if tokens >= 8192 else tokens // 256 * 256


def tp_search(model: MemoryModel, node_gpus: int, start: int) -> tuple[Considered | None, list[int]]:
    """The smallest power-of-two TP from `start` up to the node's GPUs (dividing the attention heads) that fits."""
    pp = model.ran.pipeline_parallel_size
    heads = model.spec.attention_heads if model.spec is not None else None
    tried: list[int] = []
    tp = max(1, start)
    while tp * pp <= node_gpus:
        if not heads or heads % tp == 0:
            tried.append(tp)
            found = try_lever(model, f"--tensor-parallel-size {tp} on {tp * pp} GPU(s)",
                              tensor_parallel_size=tp, gpu_count=tp * pp)
            if found is not None:
                return found, tried
        tp *= 2
    return None, tried


def advice_for_weights(model: MemoryModel, node_gpus: int | None) -> list[Advice]:
    """What would hold the weights when no change to this pod does: more or bigger GPUs (named
    instance types), fewer bits (the quantized variant and its size), a larger MIG slice."""
    weights = model.weights_gib(model.fit(tensor_parallel_size=1, pipeline_parallel_size=1, gpu_count=1))
    grant, items = model.grant, []
    if weights is not None:
        total = weights[0]
        card = model.budget.capacity.value if model.budget.capacity is not None else None
        items.append(Advice(kind=AdviceKind.NOTE, text=f"the weights are about {total:.1f} GiB in all ({weights[1]})"))
        if card and grant.whole_card:  # TP cannot span MIG slices or vNPUs: more slices never help
            items.append(_more_devices(total, card, grant))
        if grant.vendor in (None, "nvidia"):  # the instance catalogue is NVIDIA's: another vendor's
            items += _instance_advice(total)   # pod would need another image, not a node selector
        items.append(_quantized_advice(model, total))
    if grant.mig_profile:
        items.append(Advice(kind=AdviceKind.LARGER_SLICE,
                            text=f"a larger MIG profile than {grant.mig_profile} (or a whole GPU) gives one device "
                                 f"more memory; TP cannot span MIG slices"))
    if grant.virtual_device:
        items.append(Advice(kind=AdviceKind.LARGER_SLICE,
                            text=f"a larger vNPU template than {grant.virtual_device} (or a whole "
                                 f"{grant.product or 'card'}) gives the pod more device memory; a pod gets one vNPU"))
    if node_gpus is not None and grant.whole_card:
        items.append(Advice(kind=AdviceKind.NOTE, text=f"this node has {node_gpus} GPU(s)"))
    return items


def _more_devices(total: float, card: float, grant: GpuGrant) -> Advice:
    """More of the pod's own devices (amd.com/gpu stays amd.com/gpu), selected by its vendor's
    device-count label where the vendor writes one."""
    need = 1
    while need < 64 and total / need > 0.8 * card:
        need *= 2
    resource = _device_resource(grant)
    vendor = accelerators.vendor_of(resource)
    count_label = vendor.count_labels[0] if vendor is not None and vendor.count_labels else None
    where = (f"a node pool that has {need}: a nodeSelector on {count_label} (or a Karpenter NodePool requirement) "
             f"gets one" if count_label else f"a node that has {need}")
    return Advice(kind=AdviceKind.MORE_DEVICES,
                  text=f"{need} of these {card:.0f} GiB devices would hold them (TP {need}, limits.{resource}: {need}) "
                       f"on {where}",
                  changes=[Change(kind="flag", name="--tensor-parallel-size", after=str(need)),
                           Change(kind="resources", name=f"limits.{resource}", after=str(need))],
                  yaml=f"nodeSelector:\n  {count_label}: \"{need}\"" if count_label else None)


def _device_resource(grant: GpuGrant) -> str:
    return grant.resource or "nvidia.com/gpu"


def _instance_advice(total: float) -> list[Advice]:
    """Named machines whose GPUs hold the weights (4 x A10G on g5.12xlarge, 8 x A100 on p4d.24xlarge)."""
    from bot.diagnosis import instances  # its models and table only when advice names machines (issue 20)

    items = []
    for p in instances.placements(total):
        inst = p.instance
        share = total / p.gpus
        items.append(Advice(
            kind=AdviceKind.INSTANCE_TYPE,
            text=f"{p.gpus} x {inst.gpu_product} on {inst.instance_type} ({inst.cloud}, {inst.gpu_count} GPU(s)): "
                 f"{total:.1f} / {p.gpus} = {share:.1f} GiB per GPU, within 80% of {inst.gpu_memory_gib:.1f} GiB",
            changes=[Change(kind="flag", name="--tensor-parallel-size", after=str(p.gpus)),
                     Change(kind="resources", name="limits.nvidia.com/gpu", after=str(p.gpus))],
            yaml=(f"nodeSelector:\n  node.kubernetes.io/instance-type: {inst.instance_type}\n"
                  f"# or, in a Karpenter NodePool's spec.template.spec.requirements:\n"
                  f"- key: node.kubernetes.io/instance-type\n  operator: In\n  values: [\"{inst.instance_type}\"]")))
    return items


def _quantized_advice(model: MemoryModel, total: float) -> Advice:
    # 4-bit with group scales is ~0.28 of bf16 (embeddings stay 16-bit), fp8 ~0.52
    of = f" of {model.spec.id}" if model.spec is not None else ""
    four, eight = total * 0.28, total * 0.52
    return Advice(kind=AdviceKind.QUANTIZED_VARIANT,
                  text=f"a pre-quantized 4-bit variant{of} (AWQ or GPTQ) needs about {four:.1f} GiB, fp8 about {eight:.1f} GiB")


def what_fits(model: MemoryModel) -> list[tuple[str, Fit]]:
    """A short table for the chosen lever: TP 1/2/4/8 with the GPU limit each needs, else
    --max-model-len at three utilizations under the chosen configuration."""
    chosen = model.chosen
    if chosen is None:
        return []
    config = chosen.fit.config
    rows: list[tuple[str, Fit]] = []
    if config.tensor_parallel_size != model.ran.tensor_parallel_size or config.gpu_count != model.ran.gpu_count:
        pp, node = config.pipeline_parallel_size, model.grant.on_node or 8
        tp = 1
        while tp * pp <= min(node, 8):
            rows.append((f"TP {tp}, limits.{_device_resource(model.grant)} {tp * pp}",
                         model.budget.fits(revised(config, tensor_parallel_size=tp, gpu_count=tp * pp))))
            tp *= 2
        return rows
    for util in (0.85, 0.90, 0.95):
        fit = model.budget.fits(revised(config, gpu_memory_utilization=util))
        rows.append((f"--gpu-memory-utilization {util:.2f}", fit))
    return rows
