"""Model shapes: parameters, layers, heads, KV heads, head size, context, experts, dtype. Pure.

Where a shape comes from, most exact first (`resolve_model`):
1. a `config.json` placed in the evidence bundle (the model's own config, as the Hub serves it);
2. the catalogue shipped in `data/models.yaml` (the published configs of the most deployed open
   models), matched from the model argument of the vLLM command line: an HF id, a local path
   holding the name, or a Hub cache folder (`models--org--name`), case-insensitive;
3. an optional look-up (`hub`, off unless the caller passes one): any callable that returns a
   config.json dict for a model id, e.g. a cached Hugging Face Hub client living in an adapter.
A quantized variant (AWQ, GPTQ, FP8, INT4/INT8, W4A16/W8A8, bnb-4bit, MXFP4, NVFP4, GGUF) is
recognised from the name and carried as `ModelSpec.quantization`.
"""

# No `from __future__ import annotations`: see bot/diagnosis/models.py (pydantic start-up cost).
import json
import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from bot.diagnosis.models import Frozen, revised
from bot.support import yamlload
from bot.support.memo import kept_for_short_texts
from bot.support.regex_text import top_level_alternative

SpecSource = Literal["catalogue", "bundle config.json", "hub"]
HubLookup = Callable[[str], dict[str, Any] | None]
CONFIG_FILE = "config.json"  # the optional bundle file
MODELS_FILE = Path(__file__).with_name("data") / "models.yaml"  # a file, as in accelerators.py

DTYPE_BYTES = {"float32": 4.0, "float": 4.0, "fp32": 4.0, "float16": 2.0, "half": 2.0, "fp16": 2.0,
               "bfloat16": 2.0, "bf16": 2.0, "auto": 2.0, "fp8": 1.0, "float8": 1.0, "int8": 1.0}


class CatalogueError(Exception):
    """A config.json or catalogue file that cannot be read (one line, no traceback)."""


class QuantSpec(Frozen):
    """How the checkpoint's weights are stored.

    bits: effective bits per quantized weight, group scales included (4-bit with a 16-bit scale and
    a 4-bit zero per group of 128 is 4 + 20/128). scope: which weights are quantized: every linear
    layer of the decoder (embeddings, lm_head and vision tower stay in the model dtype) or only the
    MoE experts (gpt-oss: MXFP4 experts, bf16 attention).
    """

    method: str
    bits: float
    scope: Literal["linear", "experts"] = "linear"


class ModelSpec(Frozen):
    """One model's shape. None = not known (never guessed)."""

    id: str
    source: SpecSource
    matched: str | None = None  # the pattern or file that identified it
    params_b: float | None = None  # total parameters, billions
    params_from_config: bool = False  # params_b was computed from the shape, not published
    active_params_b: float | None = None
    layers: int | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    attention_heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    max_positions: int | None = None
    vocab_size: int | None = None
    tied_embeddings: bool = False
    experts: int | None = None
    experts_active: int | None = None
    shared_experts: int = 0
    moe_intermediate_size: int | None = None
    dense_layers: int = 0  # DeepSeek's first_k_dense_replace: leading layers with a dense MLP
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None  # set = multi-head latent attention (MLA)
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    sliding_window: int | None = None
    vision_params_b: float = 0.0
    dtype: str = "bfloat16"
    quantization: QuantSpec | None = None

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def moe(self) -> bool:
        return bool(self.experts)


# ---- quantization from a name, a flag or a config ----------------------------------------------

GROUP = 128  # AutoAWQ / GPTQ default group size


def grouped_bits(bits: float, group: int | None = GROUP) -> float:
    """Bits per weight with a 16-bit scale and a `bits`-wide zero point per group."""
    return bits + (16 + bits) / group if group else bits


# name token -> (method, bits); searched in order, the first hit wins
_NAME_QUANT: list[tuple[re.Pattern[str], str, float]] = [
    (re.compile(r"awq"), "awq", grouped_bits(4)),
    (re.compile(r"gptq.*(?:int8|8bit|8-bit)|(?:int8|8bit)-gptq"), "gptq", grouped_bits(8)),
    (re.compile(r"gptq"), "gptq", grouped_bits(4)),
    (re.compile(r"bnb-?8bit|8bit-bnb"), "bitsandbytes", 8.0),
    (re.compile(r"bnb|nf4|(?<![a-z])4bit"), "bitsandbytes", 4.13),  # nf4, blocks of 64, double-quantized scales
    (re.compile(r"mxfp4"), "mxfp4", 4.25),  # 4-bit values, one 8-bit scale per 32
    (re.compile(r"nvfp4|(?<![a-z])fp4"), "nvfp4", 4.5),  # 4-bit values, one fp8 scale per 16
    (re.compile(r"fp8"), "fp8", 8.0),
    (re.compile(r"w8a8|w8a16|int8"), "int8", 8.0),
    (re.compile(r"w4a16|int4"), "int4", grouped_bits(4)),
    (re.compile(r"gguf|q4-k-m|q4-0"), "gguf", 4.85),  # Q4_K_M averages about 4.85 bits
]

# the --quantization flag's values -> (method, bits); None bits = the flag alone does not say
_FLAG_QUANT: dict[str, tuple[str, float | None]] = {
    "fp8": ("fp8", 8.0), "fbgemm_fp8": ("fp8", 8.0), "ptpc_fp8": ("fp8", 8.0), "modelopt": ("fp8", 8.0),
    "awq": ("awq", grouped_bits(4)), "awq_marlin": ("awq", grouped_bits(4)), "auto_awq": ("awq", grouped_bits(4)),
    "gptq": ("gptq", None), "gptq_marlin": ("gptq", None), "auto_gptq": ("gptq", None),
    "bitsandbytes": ("bitsandbytes", 4.13), "mxfp4": ("mxfp4", 4.25), "gpt_oss_mxfp4": ("mxfp4", 4.25),
    "modelopt_fp4": ("nvfp4", 4.5), "nvfp4": ("nvfp4", 4.5), "experts_int8": ("int8", 8.0),
    "gguf": ("gguf", 4.85), "compressed-tensors": ("compressed-tensors", None),
}


def quant_from_name(model_arg: str | None) -> QuantSpec | None:
    text = normalise(model_arg or "")
    for pattern, method, bits in _NAME_QUANT:
        if pattern.search(text):
            return QuantSpec(method=method, bits=round(bits, 4))
    return None


def quant_from_flag(value: str | None, checkpoint: QuantSpec | None = None) -> QuantSpec | None:
    """--quantization VALUE; a method the checkpoint already has keeps the checkpoint's bits."""
    if not value or value.lower() in {"none", "null"}:
        return None
    method, bits = _FLAG_QUANT.get(value.lower(), (value.lower(), None))
    if checkpoint is not None and (bits is None or checkpoint.method == method):
        return checkpoint
    if bits is None:
        bits = grouped_bits(4) if method == "gptq" else None
    if bits is None:
        return None
    scope: Literal["linear", "experts"] = "experts" if value.lower() == "experts_int8" else "linear"
    return QuantSpec(method=method, bits=round(bits, 4), scope=scope)


def quant_from_config(qc: Any) -> QuantSpec | None:
    """A config.json `quantization_config`."""
    if not isinstance(qc, dict):
        return None
    method = str(qc.get("quant_method") or "").lower()
    bits = qc.get("bits") or qc.get("w_bit") or qc.get("num_bits")
    groups = qc.get("config_groups")
    if bits is None and isinstance(groups, dict):  # compressed-tensors
        weights = next((g.get("weights") for g in groups.values() if isinstance(g, dict) and g.get("weights")), None)
        bits = (weights or {}).get("num_bits")
    if method == "bitsandbytes":
        return QuantSpec(method=method, bits=4.13 if qc.get("load_in_4bit", True) else 8.0)
    if method == "mxfp4":
        return QuantSpec(method=method, bits=4.25, scope="experts")
    if method in {"fp8", "fbgemm_fp8"} and bits is None:
        bits = 8
    if bits is None:
        return None
    group = qc.get("group_size") or qc.get("q_group_size")
    effective = grouped_bits(float(bits), int(group)) if isinstance(group, int) and group > 0 else float(bits)
    return QuantSpec(method=method or "unknown", bits=round(effective, 4))


# ---- a config.json into a ModelSpec ----------------------------------------------------------


def _int(config: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    return None


def _flatten(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal configs nest the language model in text_config / llm_config: its keys win."""
    flat = dict(config)
    for key in ("text_config", "llm_config", "language_config"):
        inner = config.get(key)
        if isinstance(inner, dict):
            flat.update({k: v for k, v in inner.items() if v is not None})
    return flat


def spec_from_config(config: dict[str, Any], model_id: str, source: SpecSource,
                     params_b: float | None = None, **extra: Any) -> ModelSpec:
    """The fields of a Hugging Face config.json (Llama/Qwen/Mistral/Gemma/Phi/DeepSeek/GLM keys)."""
    c = _flatten(config)
    heads = _int(c, "num_attention_heads", "n_head")
    hidden = _int(c, "hidden_size", "d_model", "n_embd")
    head_dim = _int(c, "head_dim", "kv_channels")
    if head_dim is None and hidden and heads:
        head_dim = hidden // heads
    dtype = str(c.get("torch_dtype") or c.get("dtype") or "bfloat16").replace("torch.", "")
    spec = ModelSpec(
        id=model_id, source=source, params_b=params_b,
        layers=_int(c, "num_hidden_layers", "num_layers", "n_layer"),
        hidden_size=hidden,
        intermediate_size=_int(c, "intermediate_size", "ffn_hidden_size"),
        attention_heads=heads,
        kv_heads=_int(c, "num_key_value_heads", "multi_query_group_num", "num_kv_heads") or heads,
        head_dim=head_dim,
        max_positions=_int(c, "max_position_embeddings", "seq_length", "max_sequence_length"),
        vocab_size=_int(c, "vocab_size", "padded_vocab_size"),
        tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        experts=_int(c, "num_local_experts", "n_routed_experts", "num_experts"),
        experts_active=_int(c, "num_experts_per_tok", "moe_topk"),
        shared_experts=_int(c, "n_shared_experts") or 0,
        moe_intermediate_size=_int(c, "moe_intermediate_size"),
        dense_layers=_int(c, "first_k_dense_replace") or 0,
        q_lora_rank=_int(c, "q_lora_rank"),
        kv_lora_rank=_int(c, "kv_lora_rank"),
        qk_rope_head_dim=_int(c, "qk_rope_head_dim"),
        qk_nope_head_dim=_int(c, "qk_nope_head_dim"),
        v_head_dim=_int(c, "v_head_dim"),
        sliding_window=_int(c, "sliding_window"),
        dtype=dtype if dtype in DTYPE_BYTES else "bfloat16",
        quantization=quant_from_config(c.get("quantization_config")),
        **extra,
    )
    if spec.params_b is None:
        computed = params_from_shape(spec)
        if computed is not None:
            spec = revised(spec, params_b=round(computed, 2), params_from_config=True)
    return spec


def _attention_params(s: ModelSpec) -> int | None:
    hidden, heads = s.hidden_size, s.attention_heads
    if not hidden or not heads:
        return None
    if s.mla:
        nope, rope, v = s.qk_nope_head_dim or 0, s.qk_rope_head_dim or 0, s.v_head_dim or 0
        q = hidden * s.q_lora_rank + s.q_lora_rank * heads * (nope + rope) if s.q_lora_rank \
            else hidden * heads * (nope + rope)
        kv = hidden * ((s.kv_lora_rank or 0) + rope) + (s.kv_lora_rank or 0) * heads * (nope + v)
        return q + kv + heads * v * hidden
    if not s.head_dim or not s.kv_heads:
        return None
    return 2 * hidden * heads * s.head_dim + 2 * hidden * s.kv_heads * s.head_dim


def params_from_shape(s: ModelSpec) -> float | None:
    """Parameters (billions) from the shape: attention + MLP or experts + embeddings (+ vision)."""
    attention = _attention_params(s)
    if attention is None or not s.layers or not s.hidden_size or not s.vocab_size:
        return None
    hidden = s.hidden_size
    if s.moe:
        expert_ffn = s.moe_intermediate_size or s.intermediate_size
        if not expert_ffn:
            return None
        moe_layer = ((s.experts or 0) + s.shared_experts) * 3 * hidden * expert_ffn + hidden * (s.experts or 0)
        dense_layer = 3 * hidden * (s.intermediate_size or 0)
        mlp = s.dense_layers * dense_layer + (s.layers - s.dense_layers) * moe_layer
    else:
        if not s.intermediate_size:
            return None
        mlp = s.layers * 3 * hidden * s.intermediate_size
    embeddings = s.vocab_size * hidden * (1 if s.tied_embeddings else 2)
    return (s.layers * attention + mlp + embeddings) / 1e9 + s.vision_params_b


def expert_params_b(s: ModelSpec) -> float | None:
    """Parameters held by the routed and shared experts (what MXFP4 / experts_int8 quantize)."""
    expert_ffn = s.moe_intermediate_size or s.intermediate_size
    if not s.moe or not s.layers or not s.hidden_size or not expert_ffn:
        return None
    per_layer = ((s.experts or 0) + s.shared_experts) * 3 * s.hidden_size * expert_ffn
    return (s.layers - s.dense_layers) * per_layer / 1e9


def embedding_params_b(s: ModelSpec) -> float | None:
    if not s.vocab_size or not s.hidden_size:
        return None
    return s.vocab_size * s.hidden_size * (1 if s.tied_embeddings else 2) / 1e9


# ---- the shipped catalogue and matching --------------------------------------------------------


class CatalogueEntry(Frozen):
    spec: ModelSpec
    patterns: tuple[str, ...]


def normalise(model_arg: str) -> str:
    """Lower case, '_' and ' ' as '-', a Hub cache folder 'models--org--name' as 'org/name', and a
    version spelled with a separator as a dot ('qwen2_5_14b' -> 'qwen2.5-14b', 'v0_3' -> 'v0.3')."""
    text = model_arg.strip().lower().replace("\\", "/")
    text = re.sub(r"models--([^/]+?)--([^/]+)", r"\1/\2", text)
    text = re.sub(r"[_\s]+", "-", text)
    return re.sub(r"(?<![\d.])(\d)-(\d)(?=-|/|$)", r"\1.\2", text)


def _entry(raw: Any, where: str) -> CatalogueEntry:
    if not isinstance(raw, dict) or not raw.get("id") or not isinstance(raw.get("config"), dict):
        raise CatalogueError(f"{where}: each entry needs an id and a config mapping")
    patterns = tuple(str(p) for p in raw.get("match") or [])
    extra = {k: raw[k] for k in ("active_params_b", "vision_params_b") if raw.get(k) is not None}
    spec = spec_from_config(raw["config"], str(raw["id"]), "catalogue", params_b=raw.get("params_b"), **extra)
    return CatalogueEntry(spec=spec, patterns=patterns)


@lru_cache(maxsize=1)
def load_catalogue() -> tuple[CatalogueEntry, ...]:
    try:
        raw = yamlload.safe_load(MODELS_FILE.read_text(encoding="utf-8"))
    except (OSError, yamlload.YAMLError) as exc:
        raise CatalogueError(f"bot/diagnosis/data/models.yaml cannot be read ({exc})") from None
    if not isinstance(raw, list):
        raise CatalogueError("bot/diagnosis/data/models.yaml: expected a list of models")
    return tuple(_entry(item, f"models.yaml entry {i + 1}") for i, item in enumerate(raw))


def _bounded(pattern: str) -> re.Pattern[str]:
    """A match pattern with a name boundary on each side: "qwen2.5-7b" must not match "qwen2.5-72b"."""
    return re.compile(rf"(?<![a-z0-9]){pattern}(?![0-9]|\.\d)")


class _Pattern:
    """One catalogue match pattern, compiled when a model name first holds its plain start.

    Compiling all 74 at the first diagnosis took half of the first match (7.6 -> 4.3 ms with the
    catalogue's loading, medians of 7 interleaved, issue 20); a model name holds the plain start of
    a few of them, and a name that does not hold a pattern's plain start cannot match it.
    tests/diagnosis/test_catalogue.py compiles every shipped pattern."""

    def __init__(self, pattern: str, entry: CatalogueEntry):
        self.pattern, self.entry = pattern, entry
        self.literal = required_literal(pattern)
        self._regex: re.Pattern[str] | None = None

    @property
    def regex(self) -> re.Pattern[str]:
        if self._regex is None:
            try:
                self._regex = _bounded(self.pattern)
            except re.error as exc:
                raise CatalogueError(f"models.yaml: {self.entry.spec.id}: bad match pattern {self.pattern!r} ({exc})"
                                     ) from None
        return self._regex


_QUANTIFIERS = "*?{"  # may repeat the character before them zero times ('+' keeps at least one)
_SPECIAL = ".^$*+?{}[]()|\\"


def required_literal(pattern: str) -> str:
    """The plain text every match of the pattern starts with ("llama-" for 'llama-?3\\.1-8b'):
    its characters up to the first special one, escaped punctuation read as itself; "" when the
    pattern has an alternative at its top level (each alternative may start differently)."""
    if top_level_alternative(pattern):
        return ""
    plain: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            escaped = pattern[i + 1 : i + 2]
            if not escaped or escaped.isalnum():  # \d, \b, \w: a class or an assertion, not a character
                break
            plain.append(escaped)
            i += 2
            continue
        if char in _QUANTIFIERS:
            plain = plain[:-1]
            break
        if char in _SPECIAL:
            break
        plain.append(char)
        i += 1
    return "".join(plain)


@lru_cache(maxsize=1)
def _patterns() -> tuple[_Pattern, ...]:
    return tuple(_Pattern(p, e) for e in load_catalogue() for p in e.patterns)


def match_model(model_arg: str | None) -> ModelSpec | None:
    """The catalogue's model for a command-line model argument, or None when none matches.

    The longest pattern match wins; a quantization named in the argument (AWQ, GPTQ-Int8, FP8,
    bnb-4bit, ...) replaces the catalogue's native one."""
    if not model_arg:
        return None
    return _match(model_arg)


@kept_for_short_texts(max_chars=200, maxsize=256)  # ~74 patterns tried on every alert's model name
def _match(model_arg: str) -> ModelSpec | None:
    text = normalise(model_arg)
    best: tuple[int, str, CatalogueEntry] | None = None
    for candidate in _patterns():
        if candidate.literal not in text:
            continue  # no match possible: the pattern stays uncompiled
        for m in candidate.regex.finditer(text):
            if best is None or len(m.group(0)) > best[0]:
                best = (len(m.group(0)), candidate.pattern, candidate.entry)
    if best is None:
        return None
    spec = best[2].spec
    named = quant_from_name(text)
    update: dict[str, Any] = {"matched": best[1]}
    if named is not None and (spec.quantization is None or named.method != spec.quantization.method):
        update["quantization"] = named
    return revised(spec, **update)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A bundle's config.json as a dict (CatalogueError with one line when it is not JSON)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        raise CatalogueError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise CatalogueError(f"{path}: line {exc.lineno} is not valid JSON ({exc.msg})") from None
    if not isinstance(doc, dict):
        raise CatalogueError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    return doc


def load_bundle_config(folder: str | Path) -> dict[str, Any] | None:
    """The optional `config.json` of an evidence bundle folder, or None when there is none."""
    path = Path(folder) / CONFIG_FILE
    return read_config_file(path) if path.is_file() else None


def resolve_model(model_arg: str | None, bundle_config: dict[str, Any] | None = None,
                  hub: HubLookup | None = None) -> ModelSpec | None:
    """The model's shape from the best source there is: bundle config.json, catalogue, then `hub`.

    The catalogue's published parameter count is kept when the bundle's config is the same model
    (config.json does not state it); a name's quantization applies to every source."""
    name = model_arg or (str(bundle_config.get("_name_or_path")) if bundle_config else "") or "model"
    known = match_model(model_arg)
    if bundle_config is not None:
        params = known.params_b if known is not None else None
        spec = spec_from_config(bundle_config, name, "bundle config.json", params_b=params, matched=CONFIG_FILE)
        return _with_name_quant(spec, model_arg)
    if known is not None:
        return known
    if hub is not None and model_arg:
        config = hub(model_arg)
        if isinstance(config, dict):
            return _with_name_quant(spec_from_config(config, model_arg, "hub", matched="hub"), model_arg)
    return None


def _with_name_quant(spec: ModelSpec, model_arg: str | None) -> ModelSpec:
    named = quant_from_name(model_arg)
    if spec.quantization is None and named is not None:
        return revised(spec, quantization=named)
    return spec
