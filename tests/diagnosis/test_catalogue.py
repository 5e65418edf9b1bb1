"""The model catalogue: its numbers agree with themselves, names match the right model, config.json reads."""

from __future__ import annotations

import json

import pytest

from bot.diagnosis.catalogue import (
    CatalogueError,
    load_bundle_config,
    load_catalogue,
    match_model,
    normalise,
    params_from_shape,
    quant_from_config,
    quant_from_flag,
    read_config_file,
    required_literal,
    resolve_model,
    spec_from_config,
)

ENTRIES = load_catalogue()
FULL = [e for e in ENTRIES if e.spec.layers]


@pytest.mark.parametrize("entry", FULL, ids=[e.spec.id for e in FULL])
def test_published_parameter_count_agrees_with_the_config(entry):
    # a mistyped layer count, width or vocabulary shows up as a parameter count that disagrees
    computed = params_from_shape(entry.spec)
    assert computed is not None
    assert computed == pytest.approx(entry.spec.params_b, rel=0.01)


@pytest.mark.parametrize("entry", FULL, ids=[e.spec.id for e in FULL])
def test_full_entries_have_every_kv_field(entry):
    s = entry.spec
    assert s.attention_heads and s.hidden_size and s.vocab_size
    if s.mla:
        assert s.kv_lora_rank and s.qk_rope_head_dim
    else:
        assert s.kv_heads and s.head_dim and s.attention_heads % s.kv_heads == 0
    if s.moe:
        assert s.experts_active and s.active_params_b and s.experts_active < (s.experts or 0)


def test_partial_entries_state_no_guessed_shape():
    partial = [e.spec for e in ENTRIES if not e.spec.layers]
    assert partial, "the vision and GLM-4.5 entries carry only their published totals"
    for s in partial:
        assert s.params_b and s.kv_heads is None and s.head_dim is None


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.spec.id for e in ENTRIES])
def test_every_entry_matches_its_own_id(entry):
    found = match_model(entry.spec.id)
    assert found is not None and found.id == entry.spec.id


@pytest.mark.parametrize("arg, model_id, quant, bits", [
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct", None, None),
    ("META-LLAMA/LLAMA-3.1-8B-INSTRUCT", "meta-llama/Llama-3.1-8B-Instruct", None, None),
    ("meta-llama/Meta-Llama-3-8B-Instruct", "meta-llama/Meta-Llama-3-8B-Instruct", None, None),
    ("/models/Meta-Llama-3.1-70B-Instruct-AWQ-INT4", "meta-llama/Llama-3.3-70B-Instruct", "awq", 4.156),
    ("/root/.cache/huggingface/hub/models--Qwen--Qwen2.5-7B-Instruct/snapshots/a09a354", "Qwen/Qwen2.5-7B-Instruct", None, None),
    ("Qwen/Qwen2.5-72B-Instruct-GPTQ-Int8", "Qwen/Qwen2.5-72B-Instruct", "gptq", 8.188),
    ("Qwen/Qwen2.5-32B-Instruct-GPTQ-Int4", "Qwen/Qwen2.5-32B-Instruct", "gptq", 4.156),
    ("neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8", "meta-llama/Llama-3.1-8B-Instruct", "fp8", 8.0),
    ("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8", "meta-llama/Llama-3.1-8B-Instruct", "int8", 8.0),
    ("RedHatAI/Meta-Llama-3.1-70B-Instruct-quantized.w4a16", "meta-llama/Llama-3.3-70B-Instruct", "int4", 4.156),
    ("unsloth/Llama-3.2-3B-Instruct-bnb-4bit", "meta-llama/Llama-3.2-3B-Instruct", "bitsandbytes", 4.13),
    ("/data/qwen2_5_14b_instruct", "Qwen/Qwen2.5-14B-Instruct", None, None),
    ("gaunernst/gemma-3-27b-it-int4-awq", "google/gemma-3-27b-it", "awq", 4.156),
    ("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B", None, None),
    ("Qwen/Qwen3-30B-A3B-Instruct-2507-FP8", "Qwen/Qwen3-30B-A3B-Instruct-2507", "fp8", 8.0),
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", None, None),
    ("deepseek-ai/DeepSeek-R1-0528", "deepseek-ai/DeepSeek-V3", "fp8", 8.0),
    ("Qwen/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct", None, None),
    ("openai/gpt-oss-120b", "openai/gpt-oss-120b", "mxfp4", 4.25),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1", None, None),
    ("TheBloke/Mixtral-8x7B-Instruct-v0.1-AWQ", "mistralai/Mixtral-8x7B-Instruct-v0.1", "awq", 4.156),
    ("microsoft/Phi-4-mini-instruct", "microsoft/Phi-4-mini-instruct", None, None),
    ("microsoft/phi-4", "microsoft/phi-4", None, None),
    ("moonshotai/Kimi-K2-Instruct", "moonshotai/Kimi-K2-Instruct", "fp8", 8.0),
])
def test_model_argument_matching(arg, model_id, quant, bits):
    spec = match_model(arg)
    assert spec is not None and spec.id == model_id
    if quant is None:
        assert spec.quantization is None
    else:
        assert spec.quantization is not None and spec.quantization.method == quant
        assert spec.quantization.bits == pytest.approx(bits, abs=0.01)


@pytest.mark.parametrize("arg", ["my-org/custom-model", "/models/served-model", "", None,
                                 "Qwen/Qwen2.5-7.5B", "Qwen/Qwen-7B-Chat", "meta-llama/Llama-3.1-8", "phi-4-multimodal"])
def test_unknown_models_are_none(arg):
    assert match_model(arg) is None


# ---- patterns compiled on first use, only when the name holds their plain start ---------------


@pytest.mark.parametrize("pattern, plain", [
    ("llama-?3\\.1-8b", "llama"),  # an optional character is not required
    ("qwen2\\.5-(?:coder-)?7b", "qwen2.5-"),  # escaped punctuation is itself
    ("mixtral-8x7b", "mixtral-8x7b"),
    ("phi-3+-mini", "phi-3"),  # '+' keeps at least one
    ("gemma-\\d+b", "gemma-"),  # a class ends it
    ("glm-4{1,2}", "glm-"),
    ("a-7b|b-7b", ""),  # each alternative may start differently
    ("(?:a|b)-7b", ""),
    ("x-(?:a|b)", "x-"),  # an alternative inside a group comes after the plain start
    ("x-[|]-y", "x-"),  # a '|' in a class is no alternative
    ("x-[]|]|y", ""),
])
def test_the_plain_start_every_match_holds(pattern, plain):
    assert required_literal(pattern) == plain


def _matches_of_every_pattern(name: str) -> tuple[str, str] | None:
    """The catalogue's match with every pattern compiled and tried, as before: the oracle."""
    import re

    text, best = normalise(name), None
    for entry in ENTRIES:
        for pattern in entry.patterns:
            for m in re.finditer(rf"(?<![a-z0-9]){pattern}(?![0-9]|\.\d)", text):
                if best is None or len(m.group(0)) > best[0]:
                    best = (len(m.group(0)), pattern, entry.spec.id)
    return (best[2], best[1]) if best else None


NAMES = ([e.spec.id for e in ENTRIES] + [p for e in ENTRIES for p in e.patterns]
         + ["/models/Meta-Llama-3.1-70B-Instruct-AWQ-INT4", "Qwen/Qwen2.5-Coder-32B-Instruct", "llama3.1-8b",
            "models--Qwen--Qwen3-30B-A3B-Thinking-2507", "phi-4-multimodal", "deepseek-v3.1-terminus",
            "glm-4-9b-0414", "kimi-k2-instruct-0905", "my-org/custom-model", "Qwen/Qwen2.5-7.5B"])


@pytest.mark.parametrize("name", NAMES)
def test_a_name_matches_as_when_every_pattern_was_tried(name):
    spec = match_model(name)
    assert ((spec.id, spec.matched) if spec else None) == _matches_of_every_pattern(name)


def test_every_shipped_pattern_compiles_and_starts_with_its_plain_start():
    from bot.diagnosis.catalogue import _patterns

    for candidate in _patterns():
        assert candidate.regex.pattern.startswith("(?<![a-z0-9])")  # a bad pattern is a CatalogueError here
        assert candidate.pattern.replace("\\", "").startswith(candidate.literal)


def test_size_boundaries_are_respected():
    assert match_model("Qwen/Qwen2.5-7B-Instruct").id != match_model("Qwen/Qwen2.5-72B-Instruct").id
    assert match_model("Qwen/Qwen3-8B").params_b == 8.19
    assert match_model("Qwen/Qwen3-30B-A3B").max_positions == 40960
    assert match_model("Qwen/Qwen3-30B-A3B-Thinking-2507").max_positions == 262144


def test_published_shapes_of_well_known_models():
    llama = match_model("meta-llama/Llama-3.1-8B-Instruct")
    assert (llama.layers, llama.kv_heads, llama.head_dim, llama.max_positions) == (32, 8, 128, 131072)
    v3 = match_model("deepseek-ai/DeepSeek-V3")
    assert v3.mla and (v3.kv_lora_rank, v3.qk_rope_head_dim, v3.layers) == (512, 64, 61)
    assert (v3.experts, v3.experts_active) == (256, 8)
    gemma = match_model("google/gemma-3-27b-it")  # nested text_config
    assert (gemma.layers, gemma.kv_heads, gemma.head_dim, gemma.vision_params_b) == (62, 16, 128, 0.42)


def test_quantization_from_flag_and_config():
    assert quant_from_flag("fp8").bits == 8.0
    assert quant_from_flag("awq_marlin").method == "awq"
    assert quant_from_flag("none") is None and quant_from_flag(None) is None
    checkpoint = quant_from_config({"quant_method": "gptq", "bits": 8, "group_size": 128})
    assert checkpoint.bits == pytest.approx(8.19, abs=0.01)
    assert quant_from_flag("gptq_marlin", checkpoint) is checkpoint  # the checkpoint says how many bits
    assert quant_from_flag("compressed-tensors") is None  # the flag alone does not say
    ct = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {"num_bits": 4}}}}
    assert quant_from_config(ct).bits == 4.0
    assert quant_from_config({"quant_method": "bitsandbytes", "load_in_4bit": True}).bits == 4.13
    assert quant_from_config({"quant_method": "mxfp4"}).scope == "experts"
    assert quant_from_config("nonsense") is None


LLAMA_LIKE_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "_name_or_path": "acme/house-model-8b", "num_hidden_layers": 32,
    "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 65536, "vocab_size": 128256, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}


def test_config_json_fields_and_computed_parameters():
    spec = spec_from_config(LLAMA_LIKE_CONFIG, "acme/house-model-8b", "bundle config.json")
    assert (spec.layers, spec.kv_heads, spec.head_dim, spec.max_positions) == (32, 8, 128, 65536)
    assert spec.params_from_config and spec.params_b == pytest.approx(8.03, abs=0.01)


def test_chatglm_style_config():
    config = {"num_layers": 40, "hidden_size": 4096, "ffn_hidden_size": 13696, "num_attention_heads": 32,
              "multi_query_group_num": 2, "kv_channels": 128, "seq_length": 131072, "padded_vocab_size": 151552}
    spec = spec_from_config(config, "glm", "bundle config.json")
    assert (spec.layers, spec.kv_heads, spec.head_dim, spec.max_positions) == (40, 2, 128, 131072)
    assert spec.params_b == pytest.approx(9.4, abs=0.05)


def test_bundle_config_file(tmp_path):
    assert load_bundle_config(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_LIKE_CONFIG))
    config = load_bundle_config(tmp_path)
    spec = resolve_model("/models/served-model", bundle_config=config)
    assert spec is not None and spec.source == "bundle config.json" and spec.layers == 32


def test_bundle_config_keeps_the_catalogue_parameter_count_and_name_quantization():
    spec = resolve_model("Qwen/Qwen2.5-7B-Instruct-AWQ", bundle_config={**LLAMA_LIKE_CONFIG, "num_hidden_layers": 28})
    assert spec.source == "bundle config.json" and spec.params_b == 7.62 and not spec.params_from_config
    assert spec.quantization is not None and spec.quantization.method == "awq"


def test_bad_config_json_is_one_clear_error(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"num_hidden_layers": 32,,}')
    with pytest.raises(CatalogueError, match=r"config.json: line 1 is not valid JSON"):
        read_config_file(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(CatalogueError, match="expected a JSON object"):
        read_config_file(bad)


def test_resolution_order_and_the_hub_seam():
    calls: list[str] = []

    def hub(model_id: str):
        calls.append(model_id)
        return LLAMA_LIKE_CONFIG if model_id == "acme/house-model-8b" else None

    assert resolve_model("meta-llama/Llama-3.1-8B-Instruct", hub=hub).source == "catalogue"
    assert calls == []  # the catalogue answered: no look-up
    spec = resolve_model("acme/house-model-8b", hub=hub)
    assert spec.source == "hub" and spec.layers == 32 and calls == ["acme/house-model-8b"]
    assert resolve_model("acme/other", hub=hub) is None
    assert resolve_model("acme/house-model-8b") is None  # off unless a look-up is passed


@pytest.mark.parametrize("arg, model_id, params", [
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "meta-llama/Llama-4-Scout-17B-16E-Instruct", 109),
    ("meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8", "meta-llama/Llama-4-Maverick-17B-128E-Instruct", 400),
    ("mistralai/Mistral-Small-3.2-24B-Instruct-2506", "mistralai/Mistral-Small-3.1-24B-Instruct-2503", 24.01),
    ("deepseek-ai/DeepSeek-R1-0528", "deepseek-ai/DeepSeek-V3", 671),
    ("Qwen/Qwen3-235B-A22B-FP8", "Qwen/Qwen3-235B-A22B", 235.1),
    ("openai/gpt-oss-120b", "openai/gpt-oss-120b", 116.8),
    ("google/gemma-3-12b-it", "google/gemma-3-12b-it", 12.19),
    ("microsoft/phi-4", "microsoft/phi-4", 14.66),
])
def test_popular_2025_2026_families(arg, model_id, params):
    spec = match_model(arg)
    assert spec is not None and (spec.id, spec.params_b) == (model_id, params)
