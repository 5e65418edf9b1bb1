"""A GPU memory budget per device, built from evidence, and a fit check for candidate settings. Pure.

Every figure says where it came from (`Figure.source`): the log (a number vLLM printed), a node
label or MIG profile (via `gpus.GpuGrant`), the model catalogue or a bundle config.json (via
`catalogue.ModelSpec`), a flag, or a default. Figures printed at the configuration that ran
(`BudgetInputs.ran`) are rescaled to a candidate (`Config`): weights by tensor x pipeline
parallelism and quantization, KV bytes per token by KV heads per GPU, layers per stage and KV
dtype. `Budget.fits(config)` then walks vLLM's start-up in order and says which stage would fail
first and by how much:

  scheduling -> startup (TP vs GPUs, free-memory check) -> weights -> profiling -> kv_sizing
  -> kv_allocation -> graph_capture -> warmup

What --gpu-memory-utilization is a fraction of, by version (shared/reference/vllm-facts.md 5.2):
always the device total, bounding weights + activations + non-torch + KV; V1 0.9.1+ also requires
total x utilization to be free at start-up; memory of other processes counts against the budget in
V0 0.6.4 and V1 0.6.5-0.9.0; CUDA graphs are inside the budget from 0.21 (outside before);
--kv-cache-memory-bytes (0.10.2+) pins the KV pool and utilization no longer sizes it.
"""

# No `from __future__ import annotations`: see bot/diagnosis/models.py (pydantic start-up cost).
import math
import re
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, PrivateAttr

from bot.diagnosis.catalogue import (
    DTYPE_BYTES,
    ModelSpec,
    QuantSpec,
    embedding_params_b,
    expert_params_b,
    quant_from_flag,
)
from bot.diagnosis.gpus import GpuGrant
from bot.diagnosis.models import Frozen, empty_dict, empty_list
from bot.support.memo import kept_for_short_texts

GIB = 2**30
BLOCK = 16
STAGES = ("scheduling", "startup", "nccl_init", "weights", "profiling", "kv_sizing", "kv_allocation",
          "graph_capture", "warmup")
NON_TORCH_DEFAULT_GIB = 0.5  # CUDA context and allocator slack of one process, single GPU
NCCL_EXTRA_GIB = 0.5  # NCCL and custom all-reduce buffers once there is more than one rank
GRAPH_DEFAULT_GIB = {"v0": 1.0, "v1": 0.5}  # piecewise V1 graphs are smaller than V0's full graphs


class Figure(Frozen):
    """One number of the budget (GiB unless the name says otherwise) and where it came from."""

    value: float
    source: str  # log | node label | MIG profile | catalogue | bundle config.json | hub | flag | default | estimate
    detail: str = ""


class Config(Frozen):
    """A configuration to test: the one that ran, or a candidate. None = vLLM's default."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    gpu_count: int | None = None  # the pod's GPU limit; None = exactly what TP x PP needs
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None  # None = the model's max_position_embeddings
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_dtype: str = "auto"
    quantization: str | None = None  # the --quantization flag
    dtype: str | None = None  # the --dtype flag
    cpu_offload_gb: float = 0.0
    kv_cache_memory_bytes: int | None = None
    enforce_eager: bool = False
    block_size: int = BLOCK

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


class LogFigures(Frozen):
    """Numbers vLLM and PyTorch printed (the caller reads them from LogFacts; same names).

    All per GPU, GiB unless tokens/blocks; printed at `BudgetInputs.ran`."""

    vllm_version: str | None = None
    engine: Literal["v0", "v1"] | None = None
    total_gpu_gib: float | None = None  # device total: profiling line, free-memory check, OOM text
    gpu_memory_utilization: float | None = None
    weights_gib: float | None = None  # "Model loading took X GiB" / "Loading model weights took X GB"
    available_kv_gib: float | None = None  # "Available KV cache memory" / "reserved for KV Cache is"
    kv_tokens: int | None = None  # V1 "GPU KV cache size: N tokens"
    gpu_blocks: int | None = None  # V0 "# GPU blocks: N"
    kv_needed_gib: float | None = None  # ValueError: "(X GiB KV cache is needed"
    required_len: int | None = None  # ... for "max seq len (L)"
    estimated_max_len: int | None = None
    activation_gib: float | None = None  # the activation increase (0.6.4's peak minus the weights)
    non_torch_gib: float | None = None
    graph_gib: float | None = None  # "Graph capturing finished in N secs, took X GiB"
    graph_estimate_gib: float | None = None  # "Estimated CUDA graph memory: X GiB total"
    free_at_start_gib: float | None = None  # "Free memory on device (F/T GiB) on startup"
    other_processes_gib: float | None = None  # memory held by other processes at the OOM
    kv_cache_memory_gib: float | None = None  # the pinned pool vLLM reported
    # the tokens the KV cache held, as the signals read them (error text, vLLM's estimate, blocks x
    # block size, or the KV size line): the same figure the explanation quotes
    kv_capacity_tokens_effective: int | None = None


class BudgetInputs(Frozen):
    # lambdas, not the classes: pydantic would build each class's signature to inspect it (models.py)
    log: LogFigures = Field(default_factory=lambda: LogFigures())
    ran: Config = Field(default_factory=lambda: Config())
    model: ModelSpec | None = None
    gpus: GpuGrant | None = None


class Rules(Frozen):
    """How this vLLM version sizes its budget."""

    engine: Literal["v0", "v1"]
    default_utilization: float
    free_memory_check: bool  # V1 0.9.1+: total x utilization must be free at start-up
    counts_graphs: bool  # 0.21+: CUDA-graph memory is profiled inside the budget
    subtracts_others: bool  # other processes' memory folds into non-torch (V0 0.6.4, V1 0.6.5-0.9.0)
    default_max_num_seqs: int


class StageCheck(Frozen):
    stage: str
    ok: bool
    need_gib: float | None = None
    have_gib: float | None = None
    detail: str = ""

    @property
    def margin_gib(self) -> float | None:
        if self.need_gib is None or self.have_gib is None:
            return None
        return round(self.have_gib - self.need_gib, 2)


class KvSource(StrEnum):
    """Where a fit's KV pool and tokens-that-fit come from: what the table says beside them."""

    LOG = "measured: vLLM's log"  # the configuration that ran, vLLM's own figures
    LOG_AND_CHANGE = "measured, then this change"  # the logged pool moved by what the change moves
    ESTIMATE = "estimate"  # the model of vLLM's sizing, nothing logged to anchor it
    NONE = "not judged"


class Fit(Frozen):
    """The verdict for one configuration: fits / fails (and where first) / unknown (no capacity)."""

    config: Config
    verdict: Literal["fits", "fails", "unknown"]
    first_failure: str | None = None
    margin_gib: float | None = None  # smallest memory margin over the stages (negative: the shortfall)
    weights_fit: bool | None = None
    kv_fits: bool | None = None  # the KV cache holds one max-model-len sequence
    kv_available_gib: float | None = None
    kv_needed_gib: float | None = None
    max_len_that_fits: int | None = None
    kv_source: KvSource = KvSource.NONE  # where kv_available_gib comes from
    tokens_source: KvSource = KvSource.NONE  # where max_len_that_fits comes from
    checks: list[StageCheck] = Field(default_factory=empty_list)
    figures: dict[str, Figure] = Field(default_factory=empty_dict)
    assumptions: list[str] = Field(default_factory=empty_list)  # figures that are defaults or estimates

    @property
    def fits(self) -> bool:
        return self.verdict == "fits"

    def fits_with(self, margin_gib: float) -> bool:
        return self.fits and (self.margin_gib is None or self.margin_gib >= margin_gib)


# ---- versions ------------------------------------------------------------------------------------


def version_tuple(text: str | None) -> tuple[int, int, int] | None:
    return _version_tuple(text or "")


@kept_for_short_texts(max_chars=40, maxsize=256)  # asked twice for every configuration a diagnosis judges
def _version_tuple(text: str) -> tuple[int, int, int] | None:
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def rules_for(version: str | None, engine: Literal["v0", "v1"] | None = None,
              capacity_gib: float | None = None, product: str | None = None) -> Rules:
    """Unknown version: the newest engine's checks, 0.9 utilization (what formulas.py assumes)
    and CUDA graphs outside the budget (the cautious reading)."""
    v = version_tuple(version)
    if engine is None or (v is not None and v >= (0, 11, 0)):
        # V1 is the default from 0.8.0 and the only engine from 0.11.0 (V0's code removed): a log
        # without V1's marks, or no log at all (plan), says nothing against it
        engine = "v1" if v is None or v >= (0, 8, 0) else "v0"
    big = (capacity_gib or 0) >= 70 and "A100" not in (product or "").upper()
    if engine == "v0":
        seqs = 256
    elif v is not None and (0, 8, 0) <= v < (0, 8, 5):
        seqs = 1024
    else:
        seqs = 1024 if big else 256
    return Rules(
        engine=engine,
        default_utilization=0.92 if v is not None and v >= (0, 22, 0) else 0.9,
        free_memory_check=engine == "v1" and (v is None or v >= (0, 9, 1)),
        counts_graphs=engine == "v1" and v is not None and v >= (0, 21, 0),
        subtracts_others=(engine == "v0" and v is not None and v[:2] == (0, 6) and v[2] == 4)
        or (engine == "v1" and v is not None and (0, 6, 5) <= v < (0, 9, 1)),
        default_max_num_seqs=seqs,
    )


def default_batched_tokens(rules: Rules, version: str | None, max_model_len: int | None,
                           capacity_gib: float | None, product: str | None) -> int:
    """The profiling batch: V0 without chunked prefill runs max(max_model_len, 2048) tokens (chunked
    prefill turns on by itself above 32K, 2048 then); `vllm serve` on V1 runs 2048, or 8192 on a
    70 GiB+ card that is not an A100 (0.9+), 16384 on 160 GiB+ (0.33)."""
    if rules.engine == "v0":
        length = max_model_len or 2048
        return max(length, 2048) if length <= 32768 else 2048
    v = version_tuple(version)
    capacity = capacity_gib or 0
    if v is not None and v >= (0, 33, 0) and capacity >= 160:
        return 16384
    if capacity >= 70 and "A100" not in (product or "").upper():
        return 8192
    return 2048


# ---- model arithmetic -----------------------------------------------------------------------------


def dtype_bytes(dtype: str | None) -> float:
    return DTYPE_BYTES.get((dtype or "auto").lower().replace("torch.", ""), 2.0)


def kv_dtype_bytes(kv_cache_dtype: str | None, model_dtype: str | None) -> float:
    """`auto` stores the KV cache in the model's dtype; fp8* in one byte; 4-bit variants in half."""
    kind = (kv_cache_dtype or "auto").lower()
    if kind == "auto":
        return dtype_bytes(model_dtype)
    if kind.startswith(("fp8", "int8")):
        return 1.0
    if "4" in kind and ("fp4" in kind or "int4" in kind or "4bit" in kind):
        return 0.5
    return dtype_bytes(kind)


def weights_total_gib(spec: ModelSpec, quant: QuantSpec | None, dtype: str | None = None) -> float | None:
    """All the model's weights (every GPU together): params x bytes, the quantized part at its bits."""
    if spec.params_b is None:
        return None
    native = dtype_bytes(dtype or spec.dtype)
    if quant is None:
        return spec.params_b * 1e9 * native / GIB
    if quant.scope == "experts":
        quantized = expert_params_b(spec)
    else:  # every decoder linear layer; embeddings, lm_head and the vision tower stay in the dtype
        embeddings = embedding_params_b(spec)
        quantized = None if embeddings is None else spec.params_b - embeddings - spec.vision_params_b
    if quantized is None:
        quantized = spec.params_b  # shape unknown: count every parameter as quantized
    rest = max(0.0, spec.params_b - quantized)
    return (quantized * quant.bits / 8 + rest * native) * 1e9 / GIB


def kv_bytes_per_token(spec: ModelSpec, tp: int = 1, pp: int = 1, kv_cache_dtype: str = "auto",
                       dtype: str | None = None) -> float | None:
    """Per GPU: 2 x KV heads per GPU (at least 1: replicated when TP > KV heads) x head dim x
    layers on the stage x bytes; MLA (DeepSeek, Kimi) stores kv_lora_rank + rope dims, on every rank."""
    if not spec.layers:
        return None
    layers = math.ceil(spec.layers / max(1, pp))
    size = kv_dtype_bytes(kv_cache_dtype, dtype or spec.dtype)
    if spec.mla:
        return float(((spec.kv_lora_rank or 0) + (spec.qk_rope_head_dim or 0)) * layers * size)
    if not spec.kv_heads or not spec.head_dim:
        return None
    heads = max(1, spec.kv_heads // max(1, tp))
    return float(2 * heads * spec.head_dim * layers * size)


def kv_heads_per_gpu(spec: ModelSpec | None, tp: int) -> float:
    """For rescaling a logged per-GPU figure: heads per GPU, or 1/TP when the model is unknown."""
    if spec is None or not spec.kv_heads:
        return 1.0 / max(1, tp)
    if spec.mla:
        return 1.0
    return float(max(1, spec.kv_heads // max(1, tp)))


def activation_estimate_gib(spec: ModelSpec | None, tokens: int, tp: int) -> float | None:
    """The profiling run's peak beyond the weights: one layer's MLP and hidden states for the whole
    batch in 16-bit (gate+up, down input, a few hidden-size buffers). Within ~15 % of what V0
    printed for Llama-3.1-8B; an estimate, tagged as one."""
    if spec is None or not spec.hidden_size:
        return None
    if spec.moe:
        ffn = (spec.moe_intermediate_size or spec.intermediate_size or 0) * (spec.experts_active or 1)
    else:
        ffn = spec.intermediate_size or 0
    if not ffn:
        return None
    return tokens * (3 * ffn / max(1, tp) + 4 * spec.hidden_size) * 2 / GIB


def sampler_estimate_gib(spec: ModelSpec | None, num_seqs: int) -> float | None:
    """The final sampler warm-up: fp32 logits and probabilities over the full vocabulary per request."""
    if spec is None or not spec.vocab_size:
        return None
    return num_seqs * spec.vocab_size * 4 * 2 / GIB


# ---- the budget ------------------------------------------------------------------------------------


def _gib(value: float) -> str:
    return f"{value:.2f} GiB"


class Budget(Frozen):
    """The evidence's memory picture; `fits` tests a configuration against it."""

    inputs: BudgetInputs
    rules: Rules
    capacity: Figure | None = None
    # A diagnosis asks the same configuration again and again (the baseline for the picture, the
    # impact and the software check; the configuration that ran inside every candidate's KV pool):
    # the budget is frozen, so each answer is computed once (issue 20). The answers are read-only.
    # Read through `_kept`: `self._x` on a pydantic model goes through its
    # __getattr__ (~1.5 us), and a diagnosis reads these ~50 times.
    _figures_by_config: dict[Config, dict[str, Figure]] = PrivateAttr(default_factory=dict)
    _fit_by_config: dict[Config, Fit] = PrivateAttr(default_factory=dict)
    # What every candidate's overhead is scaled from, the same for all of them: the logged overhead
    # and the estimate at the configuration that ran, each worked out when first needed.
    _logged_overhead: list[tuple[float, float | None, str] | None] = PrivateAttr(default_factory=list)
    _ran_overhead_estimate: list[tuple[float | None, float]] = PrivateAttr(default_factory=list)

    def _kept(self, name: str) -> Any:
        """A private attribute's value, read without pydantic's __getattr__ (see above)."""
        private = self.__pydantic_private__
        assert private is not None  # set when the model is made: it declares private attributes
        return private[name]

    def quantization(self, config: Config) -> QuantSpec | None:
        """The weights' storage under `config`: the flag (fp8 on a bf16 model quantizes online), else the checkpoint's."""
        checkpoint = self.inputs.model.quantization if self.inputs.model else None
        if config.quantization:
            return quant_from_flag(config.quantization, checkpoint)
        return checkpoint

    def max_model_len(self, config: Config) -> Figure | None:
        if config.max_model_len:
            return Figure(value=config.max_model_len, source="flag", detail="--max-model-len")
        spec = self.inputs.model
        if spec is not None and spec.max_positions:
            return Figure(value=spec.max_positions, source=spec.source, detail=f"{spec.id} max_position_embeddings")
        return None

    def figures(self, config: Config) -> dict[str, Figure]:
        kept: dict[Config, dict[str, Figure]] = self._kept("_figures_by_config")
        figures = kept.get(config)
        if figures is None:
            figures = kept[config] = self._compute_figures(config)
        return figures

    def _compute_figures(self, config: Config) -> dict[str, Figure]:
        out: dict[str, Figure] = {}
        if self.capacity is not None:
            out["capacity"] = self.capacity
            out["utilization"] = self._utilization(config)
            out["budget"] = Figure(value=round(self.capacity.value * out["utilization"].value, 2), source="computed",
                                   detail=f"{_gib(self.capacity.value)} x {out['utilization'].value}")
            out["others"] = self.others()
        for name, figure in (("weights", _weights(self, config)), ("kv_bytes_per_token", _kv_per_token(self, config)),
                             ("max_model_len", self.max_model_len(config))):
            if figure is not None:
                out[name] = figure
        out.update(_overhead(self, config))
        out["graph"] = _graph(self, config)
        sampler = sampler_estimate_gib(self.inputs.model, config.max_num_seqs or self.rules.default_max_num_seqs)
        if sampler is not None and self.rules.engine == "v1":
            out["sampler"] = Figure(value=round(sampler, 2), source="estimate",
                                    detail="fp32 logits and probabilities, max_num_seqs x vocabulary")
        return out

    def _utilization(self, config: Config) -> Figure:
        if config.gpu_memory_utilization is not None:
            return Figure(value=config.gpu_memory_utilization, source="flag", detail="--gpu-memory-utilization")
        logged = self.inputs.log.gpu_memory_utilization
        if config == self.inputs.ran and logged is not None:
            return Figure(value=logged, source="log")
        version = self.inputs.log.vllm_version or "unknown version"
        return Figure(value=self.rules.default_utilization, source="default", detail=f"vLLM's default ({version})")

    def others(self) -> Figure:
        log = self.inputs.log
        if log.other_processes_gib is not None:
            return Figure(value=log.other_processes_gib, source="log", detail="other processes at the OOM")
        if log.free_at_start_gib is not None and self.capacity is not None:
            held = max(0.0, self.capacity.value - log.free_at_start_gib)
            return Figure(value=round(held, 2), source="log", detail=f"{_gib(self.capacity.value)} total - "
                                                                     f"{_gib(log.free_at_start_gib)} free at start-up")
        return Figure(value=0.0, source="default", detail="no other process seen")

    def logged_overhead(self) -> tuple[float, float | None, str] | None:
        """`_logged_overhead`, computed once (a one-item list: None is an answer)."""
        kept: list[tuple[float, float | None, str] | None] = self._kept("_logged_overhead")
        if not kept:
            kept.append(_logged_overhead(self))
        return kept[0]

    def ran_overhead_estimate(self) -> tuple[float | None, float]:
        """`_overhead_estimate` at the configuration that ran, computed once."""
        kept: list[tuple[float | None, float]] = self._kept("_ran_overhead_estimate")
        if not kept:
            kept.append(_overhead_estimate(self, self.inputs.ran))
        return kept[0]

    def fits(self, config: Config) -> Fit:
        kept: dict[Config, Fit] = self._kept("_fit_by_config")
        fit = kept.get(config)
        if fit is None:
            fit = kept[config] = self._judge(config)
        return fit

    def _judge(self, config: Config) -> Fit:
        figures = self.figures(config)
        checks = _topology_checks(self, config)
        assumptions = [f"{name} {f.value:g} ({f.source}{': ' + f.detail if f.detail else ''})"
                       for name, f in figures.items() if f.source in {"default", "estimate"}]
        if "capacity" not in figures or "weights" not in figures:
            failed = next((c.stage for c in checks if not c.ok), None)
            missing = "GPU memory" if "capacity" not in figures else "weights size"
            return Fit(config=config, verdict="fails" if failed else "unknown", first_failure=failed, checks=checks,
                       figures=figures, assumptions=[*assumptions, f"no {missing} figure: memory not judged"])
        memory, kv = _memory_checks(self, config, figures)
        checks += memory
        failed = next((c.stage for c in checks if not c.ok), None)
        margins = [margin for margin in (c.margin_gib for c in memory) if margin is not None]  # each computed once
        weights_check = next((c for c in memory if c.stage == "weights"), None)
        kv_check = next((c for c in memory if c.stage == "kv_sizing"), None)
        return Fit(config=config, verdict="fails" if failed else "fits", first_failure=failed,
                   margin_gib=min(margins) if margins else None,
                   weights_fit=weights_check.ok if weights_check else None,
                   kv_fits=kv_check.ok if kv_check and kv.needed is not None else None,
                   kv_available_gib=round(kv.available, 2), kv_needed_gib=kv.needed,
                   max_len_that_fits=kv.max_len, kv_source=kv.source, tokens_source=kv.tokens_source, checks=checks, figures=figures,
                   assumptions=assumptions)

    def baseline(self) -> Fit:
        """The configuration that ran, checked against its own evidence."""
        return self.fits(self.inputs.ran)


def build_budget(inputs: BudgetInputs) -> Budget:
    grant, log = inputs.gpus, inputs.log
    capacity: Figure | None = None
    if log.total_gpu_gib:
        capacity = Figure(value=log.total_gpu_gib, source="log", detail="device total vLLM/PyTorch printed")
    elif grant is not None and grant.memory_gib:
        what = f"MIG {grant.mig_profile}" if grant.mig_profile else (grant.product or "GPU")
        capacity = Figure(value=grant.memory_gib, source=grant.memory_source, detail=what)
    rules = rules_for(log.vllm_version, log.engine, capacity.value if capacity else None,
                      grant.product if grant else None)
    return Budget(inputs=inputs, rules=rules, capacity=capacity)


# ---- figures under a configuration ----------------------------------------------------------------


def _weights(b: Budget, config: Config) -> Figure | None:
    """Per GPU. A logged figure is rescaled by TP x PP and by the quantization/dtype ratio."""
    spec, log, ran = b.inputs.model, b.inputs.log, b.inputs.ran
    quant, ran_quant = b.quantization(config), b.quantization(ran)
    estimate = weights_total_gib(spec, quant, config.dtype) if spec is not None else None
    offload = f" - {config.cpu_offload_gb:g} GiB offloaded to CPU" if config.cpu_offload_gb else ""
    if log.weights_gib is not None:
        total = (log.weights_gib + ran.cpu_offload_gb) * ran.world_size
        detail = f"Model loading took {log.weights_gib:g} GiB at TP {ran.tensor_parallel_size} x PP {ran.pipeline_parallel_size}"
        source = "log"
        if (quant, config.dtype) != (ran_quant, ran.dtype):
            ran_estimate = weights_total_gib(spec, ran_quant, ran.dtype) if spec is not None else None
            if spec is None or not estimate or not ran_estimate:
                return None  # a storage change on an unknown model: no honest figure
            total *= estimate / ran_estimate
            detail += f", x {estimate / ran_estimate:.2f} for {quant.method if quant else config.dtype or spec.dtype}"
        if config.world_size != ran.world_size:
            source = "log, rescaled"
        per_gpu = max(0.0, total / config.world_size - config.cpu_offload_gb)
        return Figure(value=round(per_gpu, 2), source=source, detail=f"{detail}; / {config.world_size}{offload}")
    if estimate is None or spec is None:
        return None
    bits = f"{quant.method} at {quant.bits:g} bits" if quant else f"{dtype_bytes(config.dtype or spec.dtype):g} bytes"
    per_gpu = max(0.0, estimate / config.world_size - config.cpu_offload_gb)
    return Figure(value=round(per_gpu, 2), source=spec.source,
                  detail=f"{spec.id}: {spec.params_b:g}B parameters, {bits} = {_gib(estimate)}; / {config.world_size}{offload}")


def _logged_kv_per_token(log: LogFigures, block_size: int) -> tuple[float, str] | None:
    if log.available_kv_gib and log.available_kv_gib > 0 and log.kv_tokens:
        return log.available_kv_gib * GIB / log.kv_tokens, f"{_gib(log.available_kv_gib)} / {log.kv_tokens:,} tokens"
    if log.available_kv_gib and log.available_kv_gib > 0 and log.gpu_blocks:
        tokens = log.gpu_blocks * block_size
        return log.available_kv_gib * GIB / tokens, f"{_gib(log.available_kv_gib)} / ({log.gpu_blocks:,} blocks x {block_size})"
    if log.kv_needed_gib and log.required_len:
        return log.kv_needed_gib * GIB / log.required_len, f"{_gib(log.kv_needed_gib)} needed for {log.required_len:,} tokens"
    if log.available_kv_gib and log.available_kv_gib > 0 and log.estimated_max_len:
        return (log.available_kv_gib * GIB / log.estimated_max_len,
                f"{_gib(log.available_kv_gib)} / estimated {log.estimated_max_len:,} tokens")
    return None


def _kv_per_token(b: Budget, config: Config) -> Figure | None:
    """Bytes per token per GPU (not GiB). Logged: rescaled for KV heads per GPU, stage layers, KV dtype."""
    spec, ran = b.inputs.model, b.inputs.ran
    logged = _logged_kv_per_token(b.inputs.log, ran.block_size)
    if logged is None:
        if spec is None:
            return None
        value = kv_bytes_per_token(spec, config.tensor_parallel_size, config.pipeline_parallel_size,
                                   config.kv_cache_dtype, config.dtype)
        if value is None:
            return None
        return Figure(value=value, source=spec.source, detail=f"{spec.id} at TP {config.tensor_parallel_size}, "
                                                              f"KV dtype {config.kv_cache_dtype}")
    per_token, how = logged
    model_dtype = config.dtype or (spec.dtype if spec else None)
    scale = kv_heads_per_gpu(spec, config.tensor_parallel_size) / kv_heads_per_gpu(spec, ran.tensor_parallel_size)
    if spec is not None and spec.layers:
        scale *= math.ceil(spec.layers / config.pipeline_parallel_size) / math.ceil(spec.layers / ran.pipeline_parallel_size)
    else:
        scale *= ran.pipeline_parallel_size / config.pipeline_parallel_size
    scale *= kv_dtype_bytes(config.kv_cache_dtype, model_dtype) / kv_dtype_bytes(ran.kv_cache_dtype, ran.dtype or model_dtype)
    source = "log" if scale == 1 else "log, rescaled"
    return Figure(value=round(per_token * scale, 1), source=source, detail=how + (f", x {scale:.3g}" if scale != 1 else ""))


def _overhead_estimate(b: Budget, config: Config) -> tuple[float | None, float]:
    """(activation estimate or None, non-torch default) under `config`."""
    capacity = b.capacity.value if b.capacity else None
    length = b.max_model_len(config)
    tokens = config.max_num_batched_tokens or default_batched_tokens(
        b.rules, b.inputs.log.vllm_version, int(length.value) if length else None, capacity,
        b.inputs.gpus.product if b.inputs.gpus else None)
    activation = activation_estimate_gib(b.inputs.model, tokens, config.tensor_parallel_size)
    return activation, NON_TORCH_DEFAULT_GIB + (NCCL_EXTRA_GIB if config.world_size > 1 else 0.0)


def _logged_overhead(b: Budget) -> tuple[float, float | None, str] | None:
    """(activation + non-torch, activation alone or None, how) at the configuration that ran."""
    log, ran = b.inputs.log, b.inputs.ran
    if log.activation_gib is not None and log.non_torch_gib is not None:
        return (log.activation_gib + log.non_torch_gib, log.activation_gib,
                f"activation peak {_gib(log.activation_gib)} + non-torch {_gib(log.non_torch_gib)}")
    utilization = log.gpu_memory_utilization or ran.gpu_memory_utilization or b.rules.default_utilization
    if b.capacity is None or log.weights_gib is None or log.available_kv_gib is None:
        return None
    graph = (log.graph_estimate_gib or 0.0) if b.rules.counts_graphs else 0.0
    others = b.others().value if b.rules.subtracts_others else 0.0
    value = b.capacity.value * utilization - log.weights_gib - log.available_kv_gib - graph - others
    if value < 0:
        return None
    return value, None, (f"{_gib(b.capacity.value)} x {utilization} - weights {_gib(log.weights_gib)} - KV "
                         f"{_gib(log.available_kv_gib)}{f' - graphs {_gib(graph)}' if graph else ''}"
                         f"{f' - others {_gib(others)}' if others else ''}")


def _overhead(b: Budget, config: Config) -> dict[str, Figure]:
    """'overhead' = activation peak + non-torch memory; 'activation' too when it is known alone."""
    activation, non_torch = _overhead_estimate(b, config)
    logged = b.logged_overhead()
    if logged is not None:
        value, logged_activation, how = logged
        ran_activation, ran_non_torch = b.ran_overhead_estimate()
        source = "log"
        if activation is not None and ran_activation is not None and (activation, non_torch) != (ran_activation, ran_non_torch):
            ratio = (activation + non_torch) / (ran_activation + ran_non_torch)
            value, source, how = value * ratio, "log, rescaled", how + f", x {ratio:.2f} for this batch and TP"
            logged_activation = logged_activation * ratio if logged_activation is not None else None
        out = {"overhead": Figure(value=round(value, 2), source=source, detail=how)}
        if logged_activation is not None:
            out["activation"] = Figure(value=round(logged_activation, 2), source=source)
        return out
    if activation is None:
        return {"overhead": Figure(value=1.0 + non_torch, source="default",
                                   detail=f"1 GiB activations + {_gib(non_torch)} non-torch (model shape unknown)")}
    return {"overhead": Figure(value=round(activation + non_torch, 2), source="estimate",
                               detail=f"activations {_gib(activation)} + non-torch {_gib(non_torch)}"),
            "activation": Figure(value=round(activation, 2), source="estimate")}


def _graph(b: Budget, config: Config) -> Figure:
    log = b.inputs.log
    if config.enforce_eager:
        return Figure(value=0.0, source="flag", detail="--enforce-eager captures no CUDA graphs")
    if log.graph_estimate_gib is not None:
        return Figure(value=log.graph_estimate_gib, source="log", detail="Estimated CUDA graph memory")
    if log.graph_gib is not None:
        return Figure(value=log.graph_gib, source="log", detail="Graph capturing finished")
    engine = b.rules.engine
    return Figure(value=GRAPH_DEFAULT_GIB[engine], source="default", detail=f"typical {engine.upper()} CUDA graphs")


# ---- the checks, in start-up order -------------------------------------------------------------------


def _topology_checks(b: Budget, config: Config) -> list[StageCheck]:
    grant, spec = b.inputs.gpus, b.inputs.model
    world, gpus = config.world_size, config.gpu_count or config.world_size
    checks: list[StageCheck] = []
    if grant is not None and grant.on_node is not None:
        allocatable = grant.on_node * ((grant.replicas or 1) if grant.shared else 1)
        checks.append(StageCheck(stage="scheduling", ok=gpus <= allocatable,
                                 detail=f"the pod asks for {gpus} GPU(s); the node can allocate {allocatable}"))
    checks.append(StageCheck(stage="startup", ok=world <= gpus,
                             detail=f"TP {config.tensor_parallel_size} x PP {config.pipeline_parallel_size} = "
                                    f"{world} GPU(s); the pod has {gpus}"))
    if spec is not None and spec.attention_heads and config.tensor_parallel_size > 1:
        checks.append(StageCheck(stage="startup", ok=spec.attention_heads % config.tensor_parallel_size == 0,
                                 detail=f"{spec.attention_heads} attention heads over TP {config.tensor_parallel_size}"))
    if grant is not None and world > 1 and not grant.can_tensor_parallel:
        checks.append(StageCheck(stage="nccl_init", ok=False,
                                 detail=f"{world} ranks cannot run across {grant.no_tensor_parallel_reason()}"))
    return checks


class _Kv(Frozen):
    available: float
    needed: float | None = None
    max_len: int | None = None
    source: KvSource = KvSource.ESTIMATE
    tokens_source: KvSource = KvSource.ESTIMATE


def _measured_tokens(b: Budget) -> int | None:
    """The tokens the KV cache held as it ran, as vLLM printed them: its KV cache size, its blocks
    x block size, or its estimate of the longest context that fits."""
    log = b.inputs.log
    if log.kv_capacity_tokens_effective:
        return log.kv_capacity_tokens_effective
    if log.kv_tokens:
        return log.kv_tokens
    if log.gpu_blocks:
        return log.gpu_blocks * b.inputs.ran.block_size
    return log.estimated_max_len or None


def _measured_pool(b: Budget, per_token: Figure | None) -> float | None:
    """The KV pool (GiB per GPU) as it ran: the one vLLM printed, else its tokens x bytes per token."""
    log = b.inputs.log
    if log.available_kv_gib is not None and log.available_kv_gib > 0:
        return log.available_kv_gib
    tokens = _measured_tokens(b)
    if tokens and per_token is not None and per_token.value > 0:
        return tokens * per_token.value / GIB
    return None


def _computed_pool(b: Budget, config: Config, f: dict[str, Figure]) -> tuple[float, str]:
    """The KV pool the model of vLLM's sizing gives: budget - weights - overhead (- graphs - others)."""
    weights, overhead, graph = f["weights"].value, f["overhead"].value, f["graph"].value
    available = f["budget"].value - weights - overhead
    how = f"budget {_gib(f['budget'].value)} - weights {_gib(weights)} - overhead {_gib(overhead)}"
    if b.rules.counts_graphs:
        available -= graph
        how += f" - CUDA graphs {_gib(graph)}"
    if b.rules.subtracts_others and f["others"].value:
        available -= f["others"].value
        how += f" - other processes {_gib(f['others'].value)}"
    return available, how


def _anchored_pool(b: Budget, config: Config, f: dict[str, Figure]) -> tuple[float, str, KvSource]:
    """(pool GiB, how, where from). What vLLM printed wins over the estimate: as it ran the pool is
    the logged one; a candidate gets the logged pool plus what the change moves in the estimate
    (so a shorter context keeps the measured pool instead of the model's guess of it)."""
    if config.kv_cache_memory_bytes:
        available = config.kv_cache_memory_bytes / GIB
        return available, f"--kv-cache-memory-bytes pins {_gib(available)}", KvSource.ESTIMATE
    computed, how = _computed_pool(b, config, f)
    measured = _measured_pool(b, f.get("kv_bytes_per_token"))
    if measured is None:
        return computed, how, KvSource.ESTIMATE
    if config == b.inputs.ran:
        return measured, f"measured: {_gib(measured)} as vLLM sized it", KvSource.LOG
    ran_figures = b.figures(b.inputs.ran)
    ran_computed, _ = _computed_pool(b, b.inputs.ran, ran_figures) if "budget" in ran_figures else (computed, "")
    delta = computed - ran_computed
    return (measured + delta, f"measured {_gib(measured)} {'+' if delta >= 0 else '-'} {_gib(abs(delta))} this change moves",
            KvSource.LOG_AND_CHANGE)


def _kv_picture(b: Budget, config: Config, f: dict[str, Figure]) -> tuple[_Kv, str]:
    available, how, source = _anchored_pool(b, config, f)
    per_token, length = f.get("kv_bytes_per_token"), f.get("max_model_len")
    needed = max_len = None
    if per_token is not None and per_token.value > 0:
        block = config.block_size
        max_len = max(0, int(available * GIB / per_token.value) // block * block)
        if length is not None:
            needed = round(math.ceil(length.value / block) * block * per_token.value / GIB, 2)
    tokens, tokens_source = _measured_tokens(b), source
    if config == b.inputs.ran and tokens:
        # vLLM's own count wins over the pool divided by a rounded (or guessed) bytes-per-token
        max_len, tokens_source = tokens, KvSource.LOG
    elif source == KvSource.LOG_AND_CHANGE and tokens and per_token is not None and per_token.value > 0:
        # vLLM's count scaled by what the change does to the pool: a change that leaves the pool
        # as it was (a shorter context) keeps vLLM's very figure, not one rounded differently
        pool = _measured_pool(b, per_token) or 0.0
        same = pool > 0 and abs(available - pool) < 0.005
        max_len = tokens if same else max(0, int(tokens * available / pool) // config.block_size * config.block_size) \
            if pool > 0 else max_len
    return _Kv(available=available, needed=needed, max_len=max_len, source=source, tokens_source=tokens_source), how


def _memory_checks(b: Budget, config: Config, f: dict[str, Figure]) -> tuple[list[StageCheck], _Kv]:
    capacity, others = f["capacity"].value, f["others"].value
    physical = capacity - others
    # Shown to 2 decimals; each check is made with it, not made and then re-validated rounded
    # (a diagnosis builds ~70 checks: a second validation each was ~10% of the diagnosis)
    have = round(physical, 2)
    weights, overhead, graph = f["weights"].value, f["overhead"].value, f["graph"].value
    kv, how = _kv_picture(b, config, f)
    checks: list[StageCheck] = []
    if b.rules.free_memory_check:
        checks.append(StageCheck(stage="startup", ok=f["budget"].value <= physical, need_gib=f["budget"].value,
                                 have_gib=have, detail="total x utilization must be free at start-up"))
    checks.append(StageCheck(stage="weights", ok=weights <= physical, need_gib=weights, have_gib=have,
                             detail=f"weights {f['weights'].detail}"))
    checks.append(StageCheck(stage="profiling", ok=weights + overhead <= physical, need_gib=round(weights + overhead, 2),
                             have_gib=have, detail=f"weights + activation peak and non-torch ({f['overhead'].detail})"))
    need = kv.needed if kv.needed is not None else 0.0
    length = f.get("max_model_len")
    holds = kv.tokens_source != KvSource.LOG or kv.max_len is None or length is None or kv.max_len >= length.value
    checks.append(StageCheck(stage="kv_sizing", ok=kv.available > 0 and kv.available >= need and holds, need_gib=need,
                             have_gib=round(kv.available, 2),
                             detail=f"KV cache {how}; one max-model-len sequence needs {_gib(need)}"))
    in_use = weights + overhead + max(0.0, kv.available)
    checks.append(StageCheck(stage="kv_allocation", ok=in_use <= physical, need_gib=round(in_use, 2), have_gib=have,
                             detail="weights + overhead + the KV pool must be physically free"))
    checks.append(StageCheck(stage="graph_capture", ok=in_use + graph <= physical, need_gib=round(in_use + graph, 2),
                             have_gib=have, detail=f"then CUDA graphs {_gib(graph)} ({f['graph'].source})"))
    if "sampler" in f:
        after = in_use + graph - (f["activation"].value if "activation" in f else 0.0) + f["sampler"].value
        checks.append(StageCheck(stage="warmup", ok=after <= physical, need_gib=round(after, 2), have_gib=have,
                                 detail=f"then the sampler warm-up {_gib(f['sampler'].value)} (estimate)"))
    return checks, kv
